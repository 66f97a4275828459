// FileStore: a Store kept in one file that several processes on one host share (file:// rendezvous).
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/store/store.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace tensorplay {

/// Settings of a FileStore.
struct FileStoreOptions {
    Duration timeout = Store::kDefaultTimeout;                       ///< default of get/wait/multi_get
    Duration poll_min = std::chrono::milliseconds(1);                ///< first poll interval of a wait
    Duration poll_max = std::chrono::milliseconds(50);               ///< the interval doubles up to this
    std::size_t max_value_size = std::size_t(1) << 30;               ///< longest value written or read
    /// The log is compacted (rewritten with only the live keys, then renamed over the file) once it
    /// is at least this long and at least twice the size of its live records; 0 never compacts.
    std::size_t compact_min_bytes = std::size_t(1) << 20;
};

/// A Store in a file: an append-only log of checksummed records that every process replays.
/// Safe against concurrent writers (flock) and against a writer that dies mid-record (a torn
/// tail is ignored by readers and cut off by the next writer). The log is compacted now and then
/// by the writer holding the lock (see FileStoreOptions::compact_min_bytes): it writes a new file
/// beside it and renames it over the path; every process notices the replaced file on its next
/// operation and replays the new one. The directory must let the store create that file (if it
/// cannot, the log just keeps growing). Waiting polls the file with a
/// doubling, bounded interval on a timer, so no thread is blocked. Thread-safe; waits support
/// Asio per-operation cancellation (Errc::cancelled). The file is never deleted by the store.
/// Opening after fork() is not needed: a child process reopens the file on first use.
class TP_API FileStore final : public Store {
public:
    /// Opens (creating if needed) the store file at `path`. Errors: io_error naming the path,
    /// store_error when the file exists but is not a FileStore.
    [[nodiscard]] static Result<std::shared_ptr<FileStore>> open(std::string path, FileStoreOptions options = {});
    ~FileStore() override;
    FileStore(const FileStore&) = delete;
    FileStore& operator=(const FileStore&) = delete;

    [[nodiscard]] const std::string& path() const noexcept;

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

    struct State;
    explicit FileStore(std::shared_ptr<State> state);

private:
    std::shared_ptr<State> state_;
};

}  // namespace tensorplay
