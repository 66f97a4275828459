// PrefixStore: forwards every operation to the base store with "<prefix>/" in front of each key.
#include <tensorplay/store/prefix_store.hpp>

namespace tensorplay {

namespace {
Failure no_base() { return fail(Errc::invalid_argument, "PrefixStore has no base store"); }
}  // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
    if (base_) timeout_ = base_->timeout();
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
}

// Each coroutine copies base_ first: the PrefixStore may go away while the base's operation runs.

Task<Result<void>> PrefixStore::set(std::string key, Bytes value) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->set(full(key), std::move(value));
}

Task<Result<Bytes>> PrefixStore::get(std::string key) {
    auto base = base_;
    if (!base) co_return no_base();
    auto k = full(key);
    if (timeout() != base->timeout()) {
        // Our own timeout differs from the base's: wait with ours, then read (the key exists now).
        std::vector<std::string> keys{k};
        if (auto w = co_await base->wait(std::move(keys), timeout()); !w) co_return fail(std::move(w).error());
    }
    co_return co_await base->get(std::move(k));
}

Task<Result<std::int64_t>> PrefixStore::add(std::string key, std::int64_t delta) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->add(full(key), delta);
}

Task<Result<Bytes>> PrefixStore::compare_set(std::string key, Bytes expected, Bytes desired) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->compare_set(full(key), std::move(expected), std::move(desired));
}

Task<Result<void>> PrefixStore::wait(std::vector<std::string> keys, Duration timeout) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->wait(full(keys), timeout);
}

Task<Result<bool>> PrefixStore::check(std::vector<std::string> keys) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->check(full(keys));
}

Task<Result<bool>> PrefixStore::delete_key(std::string key) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->delete_key(full(key));
}

Task<Result<std::int64_t>> PrefixStore::num_keys() {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->num_keys();
}

Task<Result<void>> PrefixStore::append(std::string key, Bytes value) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->append(full(key), std::move(value));
}

Task<Result<std::vector<Bytes>>> PrefixStore::multi_get(std::vector<std::string> keys) {
    auto base = base_;
    if (!base) co_return no_base();
    auto ks = full(keys);
    if (timeout() != base->timeout()) {
        if (auto w = co_await base->wait(ks, timeout()); !w) co_return fail(std::move(w).error());
    }
    co_return co_await base->multi_get(std::move(ks));
}

Task<Result<void>> PrefixStore::multi_set(std::vector<std::string> keys, std::vector<Bytes> values) {
    auto base = base_;
    if (!base) co_return no_base();
    co_return co_await base->multi_set(full(keys), std::move(values));
}

bool PrefixStore::has_extended_api() const noexcept { return base_ && base_->has_extended_api(); }

}  // namespace tensorplay
