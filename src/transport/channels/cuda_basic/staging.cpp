// cuda_basic's chunked staging: device-to-host copies into a few pinned slots, each handed to the
// connection's writer once its event completed, each slot refilled once its chunk was written.
#include "transport/channels/cuda_basic/staging.hpp"

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

namespace tensorplay::detail {

namespace {

/// What the queued copies read and write: held by the source and by each copy (its keep-alive).
struct Pipeline {
    Tensor tensor;
    std::vector<std::shared_ptr<Storage>> slots;
};

class ChunkedStaging final : public ByteSource {
public:
    ChunkedStaging(DeviceBackend& b, tensorplay::Stream stream, std::shared_ptr<Pipeline> p, std::size_t chunk)
        : b_(b), stream_(stream), p_(std::move(p)), chunk_(chunk), total_(p_->tensor.nbytes()) {}

    /// Queues the copies of the first chunks, one per slot.
    Result<void> start() {
        for (std::size_t k = 0; k < p_->slots.size() && queued_ < total_; ++k)
            if (auto q = queue_next(); !q) return q;
        return ok();
    }

    Task<Result<std::span<const std::uint8_t>>> next() override {
        // The piece handed out last was written: its slot takes the next chunk not yet queued.
        if (handed_ > 0 && queued_ < total_)
            if (auto q = queue_next(); !q) co_return fail(std::move(q).error());
        if (handed_ == total_) co_return std::span<const std::uint8_t>{};
        tensorplay::Event ready = std::move(ready_.front());
        ready_.pop_front();
        auto w = co_await b_.wait(std::move(ready));
        if (!w) co_return fail(std::move(w).error().context("staging " + p_->tensor.device().str() + " bytes at " + std::to_string(handed_)));
        const std::size_t n = std::min(chunk_, total_ - handed_);
        Storage& slot = *p_->slots[(handed_ / chunk_) % p_->slots.size()];
        handed_ += n;
        co_return std::span<const std::uint8_t>(slot.data(), n);
    }

private:
    Result<void> queue_next() {
        const std::size_t n = std::min(chunk_, total_ - queued_);
        Storage& slot = *p_->slots[(queued_ / chunk_) % p_->slots.size()];
        if (auto c = b_.copy_async(stream_, slot.data(), p_->tensor.data() + queued_, n, p_); !c) return c;
        auto ev = b_.record_event(stream_);
        if (!ev) return fail(std::move(ev).error());
        ready_.push_back(std::move(*ev));
        queued_ += n;
        return ok();
    }

    DeviceBackend& b_;
    tensorplay::Stream stream_;
    std::shared_ptr<Pipeline> p_;
    std::size_t chunk_, total_;
    std::size_t queued_ = 0, handed_ = 0;  ///< bytes whose copies were queued; bytes handed out
    std::deque<tensorplay::Event> ready_;  ///< per queued chunk not handed out yet, in order
};

/// What the queued host-to-device copies read and write (their keep-alive).
struct Landing {
    std::shared_ptr<Storage> device;
    std::vector<std::shared_ptr<Storage>> slots;
};

class ChunkedLanding final : public ByteSink {
public:
    ChunkedLanding(DeviceBackend& b, tensorplay::Stream stream, std::shared_ptr<Landing> p, std::size_t chunk, std::size_t nbytes,
                   DType dtype, std::vector<std::int64_t> shape)
        : b_(b), stream_(stream), p_(std::move(p)), chunk_(chunk), total_(nbytes), dtype_(dtype),
          shape_(std::move(shape)), copied_(p_->slots.size()) {}

    Task<Result<std::span<std::uint8_t>>> next() override {
        if (auto q = queue_filled(); !q) co_return fail(std::move(q).error());
        const std::size_t slot = (filled_ / chunk_) % p_->slots.size();
        // The slot's previous chunk must have gone up before the reader writes over it.
        tensorplay::Event before = std::move(copied_[slot]);
        copied_[slot] = {};
        if (auto w = co_await b_.wait(std::move(before)); !w) co_return fail(std::move(w).error().context("landing a staged chunk"));
        handed_ = filled_ + std::min(chunk_, total_ - filled_);
        co_return std::span<std::uint8_t>(p_->slots[slot]->data(), handed_ - filled_);
    }

    Result<Tensor> finish() override {
        if (auto q = queue_filled(); !q) return fail(std::move(q).error());
        if (filled_ != total_)
            return fail(Errc::internal,
                        "a staged tensor landed " + std::to_string(filled_) + " of its " + std::to_string(total_) + " bytes");
        return Tensor::wrap(p_->device, dtype_, shape_);
    }

private:
    /// Queues the copy up of the piece handed out last (the reader filled it).
    Result<void> queue_filled() {
        if (handed_ == filled_) return ok();
        const std::size_t slot = (filled_ / chunk_) % p_->slots.size();
        auto c = b_.copy_async(stream_, p_->device->data() + filled_, p_->slots[slot]->data(), handed_ - filled_, p_);
        if (!c) return c;
        auto ev = b_.record_event(stream_);
        if (!ev) return fail(std::move(ev).error());
        copied_[slot] = std::move(*ev);
        filled_ = handed_;
        return ok();
    }

    DeviceBackend& b_;
    tensorplay::Stream stream_;
    std::shared_ptr<Landing> p_;
    std::size_t chunk_, total_;
    DType dtype_;
    std::vector<std::int64_t> shape_;
    std::size_t filled_ = 0, handed_ = 0;      ///< bytes read and queued up; bytes handed out
    std::vector<tensorplay::Event> copied_;    ///< per slot: its last copy up (default: none)
};

}  // namespace

Result<std::shared_ptr<ByteSink>> land_in_chunks(DeviceBackend& backend, tensorplay::Stream stream, DType dtype,
                                                 std::vector<std::int64_t> shape, std::size_t nbytes, std::size_t chunk,
                                                 std::size_t slots) {
    if (chunk == 0 || slots == 0) return fail(Errc::invalid_argument, "landing needs a chunk size and at least one slot");
    auto p = std::make_shared<Landing>();
    auto device = backend.allocate_on(stream, nbytes);
    if (!device) return fail(std::move(device).error().context("landing " + std::to_string(nbytes) + " bytes"));
    p->device = std::move(*device);
    const std::size_t chunks = (nbytes + chunk - 1) / chunk;
    for (std::size_t k = 0; k < std::min(slots, chunks); ++k) {
        auto slot = backend.allocate_host(chunk, stream.device);
        if (!slot) return fail(std::move(slot).error().context("a landing slot for " + stream.device.str()));
        p->slots.push_back(std::move(*slot));
    }
    auto sink = std::make_shared<ChunkedLanding>(backend, stream, std::move(p), chunk, nbytes, dtype, std::move(shape));
    return std::shared_ptr<ByteSink>(std::move(sink));
}

Result<std::shared_ptr<ByteSource>> stage_in_chunks(DeviceBackend& backend, tensorplay::Stream stream, Tensor tensor,
                                                    std::size_t chunk, std::size_t slots) {
    if (chunk == 0 || slots == 0) return fail(Errc::invalid_argument, "staging needs a chunk size and at least one slot");
    auto p = std::make_shared<Pipeline>();
    const std::size_t chunks = (tensor.nbytes() + chunk - 1) / chunk;
    p->tensor = std::move(tensor);
    for (std::size_t k = 0; k < std::min(slots, chunks); ++k) {
        auto slot = backend.allocate_host(chunk, p->tensor.device());
        if (!slot) return fail(std::move(slot).error().context("a staging slot for " + p->tensor.device().str()));
        p->slots.push_back(std::move(*slot));
    }
    auto source = std::make_shared<ChunkedStaging>(backend, stream, std::move(p), chunk);
    if (auto s = source->start(); !s) return fail(std::move(s).error());
    return std::shared_ptr<ByteSource>(std::move(source));
}

}  // namespace tensorplay::detail
