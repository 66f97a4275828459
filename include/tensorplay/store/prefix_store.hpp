// PrefixStore: a view of another Store whose keys all live under "<prefix>/", as c10d's PrefixStore.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/store/store.hpp>

#include <memory>
#include <string>

namespace tensorplay {

/// Maps every key k to prefix + "/" + k on `base` (nesting gives "outer/inner/k", as torch does).
/// num_keys() is the base store's count (c10d counts every key). The timeout starts as the base
/// store's and can be changed independently. Thread-safety and cancellation are the base store's.
/// A null base makes every operation fail with Errc::invalid_argument.
class TP_API PrefixStore final : public Store {
public:
    PrefixStore(std::string prefix, std::shared_ptr<Store> base);

    [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
    [[nodiscard]] const std::shared_ptr<Store>& base() const noexcept { return base_; }

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
    [[nodiscard]] bool has_extended_api() const noexcept override;

private:
    [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
    [[nodiscard]] std::vector<std::string> full(const std::vector<std::string>& keys) const;

    std::string prefix_;
    std::shared_ptr<Store> base_;
};

}  // namespace tensorplay
