// Private pieces shared by the device backends: event state, host storage, the await helper.
#pragma once

#include <tensorplay/device/backend.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace tensorplay::detail {

/// The shared state behind an Event. Backends subclass it (the host one below serves cpu and sim).
class EventState {
public:
    virtual ~EventState() = default;
    [[nodiscard]] virtual bool ready() const noexcept = 0;
    /// Calls `fn` once the event is complete: at once on this thread when it already is,
    /// otherwise on whichever thread completes it. `fn` must not block.
    virtual void on_ready(std::function<void()> fn) = 0;
};

/// The backends' side of an Event: made from a state, and its state read back.
struct EventAccess {
    [[nodiscard]] static Event make(std::shared_ptr<EventState> state) noexcept { return Event(std::move(state)); }
    [[nodiscard]] static const std::shared_ptr<EventState>& state(const Event& e) noexcept { return e.state_; }
};

/// An event completed by a host thread.
class HostEventState final : public EventState {
public:
    bool ready() const noexcept override;
    void on_ready(std::function<void()> fn) override;
    /// Marks the event complete and runs the waiters (outside the lock).
    void complete();

private:
    mutable std::mutex mutex_;
    bool done_ = false;
    std::vector<std::function<void()>> waiters_;
};

/// Host memory: 2 MiB-aligned mmap with MADV_HUGEPAGE for large buffers, reused through a small
/// cache of freed mappings (so that filling fresh
/// memory is not page-fault bound), 64-byte aligned operator new for small ones.
class HostStorage final : public Storage {
public:
    /// nullptr when memory is exhausted.
    static std::shared_ptr<HostStorage> create(Device device, std::size_t nbytes);
    HostStorage(Device device, std::uint8_t* data, std::size_t size, std::size_t mapped) noexcept
        : device_(device), data_(data), size_(size), mapped_(mapped) {}
    ~HostStorage() override;
    HostStorage(const HostStorage&) = delete;
    HostStorage& operator=(const HostStorage&) = delete;

    Device device() const noexcept override { return device_; }
    std::uint8_t* data() noexcept override { return data_; }
    std::size_t size() const noexcept override { return size_; }
    /// True when the buffer came from mmap (large, huge-page advised).
    bool mapped() const noexcept { return mapped_ != 0; }

private:
    Device device_;
    std::uint8_t* data_;
    std::size_t size_;
    std::size_t mapped_;  // length of the mapping; 0 for operator new
};

/// Buffers at least this large are mmap'd, 2 MiB aligned, with MADV_HUGEPAGE.
inline constexpr std::size_t huge_alloc_threshold = std::size_t{1} << 20;

/// Resumes the awaiting coroutine on its executor once `state` is ready (at once if null/ready).
[[nodiscard]] Task<Result<void>> await_event(std::shared_ptr<EventState> state);

/// The sim backend (tests only).
[[nodiscard]] std::shared_ptr<DeviceBackend> make_sim_backend(SimBackendOptions options);

}  // namespace tensorplay::detail
