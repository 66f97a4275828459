// HashStore: an in-process Store with c10d semantics, for tests and single-process groups.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/store/store.hpp>

#include <cstddef>
#include <memory>

namespace tensorplay {

/// A Store held in this process's memory.
/// Thread-safe: coroutines on any executors and threads may use one HashStore at once.
/// Waiting (get, wait, multi_get) blocks no thread; a waiter is woken by set, add, append,
/// multi_set or compare_set of its keys. Waits support Asio per-operation cancellation
/// (terminal, partial and total): a cancelled wait ends with Errc::cancelled and leaves nothing
/// registered. Destroying the store ends pending waits with Errc::shutdown.
class TP_API HashStore final : public Store {
public:
    explicit HashStore(Duration timeout = kDefaultTimeout);
    ~HashStore() override;
    HashStore(const HashStore&) = delete;
    HashStore& operator=(const HashStore&) = delete;

    [[nodiscard]] Task<Result<void>> set(std::string key, Bytes value) override;
    [[nodiscard]] Task<Result<Bytes>> get(std::string key) override;
    [[nodiscard]] Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) override;
    [[nodiscard]] Task<Result<Bytes>> compare_set(std::string key, Bytes expected, Bytes desired) override;
    using Store::wait;
    [[nodiscard]] Task<Result<void>> wait(std::vector<std::string> keys, Duration timeout) override;
    [[nodiscard]] Task<Result<bool>> check(std::vector<std::string> keys) override;
    [[nodiscard]] Task<Result<bool>> delete_key(std::string key) override;
    [[nodiscard]] Task<Result<std::int64_t>> num_keys() override;
    [[nodiscard]] Task<Result<void>> append(std::string key, Bytes value) override;
    [[nodiscard]] Task<Result<std::vector<Bytes>>> multi_get(std::vector<std::string> keys) override;
    [[nodiscard]] Task<Result<void>> multi_set(std::vector<std::string> keys, std::vector<Bytes> values) override;

    /// Number of waits registered right now (for tests: a finished or cancelled wait leaves none).
    [[nodiscard]] std::size_t pending_waiters() const;

    struct State;  ///< private; public only so that the implementation's helpers can name it

private:
    std::shared_ptr<State> state_;
};

}  // namespace tensorplay
