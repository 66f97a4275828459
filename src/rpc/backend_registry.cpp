// The backend registry: a process-wide, thread-safe map name -> handlers, TENSORPIPE built in.
#include <tensorplay/rpc/backend_registry.hpp>

#include "rpc/tensorpipe_backend.hpp"

#include <tensorplay/core/timeout.hpp>

#include <cstdio>
#include <mutex>
#include <ostream>

namespace tensorplay {

// The only maker of BackendType values.
struct BackendTypeFactory {
    static BackendType make(std::string name) { return BackendType(std::move(name)); }
};

namespace {

struct Registry {
    std::mutex mutex;
    std::map<std::string, BackendValue, std::less<>> backends;

    Registry() {
        // Built in, as the seed's BackendType starts with TENSORPIPE.
        backends.emplace("TENSORPIPE", BackendValue{detail::tensorpipe_construct_rpc_backend_options_handler,
                                                    detail::tensorpipe_init_backend_handler});
    }
};

// Function-local static: initialised on first use, so registering from another file's static
// initialiser is safe whatever the order in which files are initialised.
Registry& registry() {
    static Registry r;
    return r;
}

// Python's repr() of a str, so that messages quote names as the seed's f"{backend!r}" does.
std::string py_repr(std::string_view s) {
    const bool has_single = s.find('\'') != std::string_view::npos;
    const bool has_double = s.find('"') != std::string_view::npos;
    const char quote = has_single && !has_double ? '"' : '\'';
    std::string out(1, quote);
    for (unsigned char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    out += quote;
    return out;
}

Failure unknown_backend(std::string_view name) {
    return fail(Errc::unknown_backend, "unknown RPC backend " + py_repr(name));
}

// The seed's _coerce_backend: a name must be registered; a BackendType always is.
Result<BackendValue> lookup(std::string_view name) {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.backends.find(name);
    if (it == r.backends.end()) return unknown_backend(name);
    return it->second;
}

}  // namespace

std::string_view kwarg_type_name(const BackendKwarg& value) noexcept {
    switch (value.index()) {
        case 0: return "None";
        case 1: return "bool";
        case 2: return "int";
        case 3: return "float";
        case 4: return "str";
        case 5: return "list[str]";
        case 6: return "list[Device]";
        case 7: return "dict[str, DeviceMap]";
    }
    return "unknown";
}

BackendType BackendType::tensorpipe() {
    (void)registry();  // make sure the built-in backends exist
    return BackendTypeFactory::make("TENSORPIPE");
}

std::ostream& operator<<(std::ostream& os, const BackendType& b) { return os << b.str(); }

bool backend_registered(std::string_view name) {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    return r.backends.find(name) != r.backends.end();
}

Result<BackendType> register_backend(std::string name, ConstructRpcBackendOptionsHandler construct_handler,
                                     InitBackendHandler init_handler) {
    if (name.empty()) return fail(Errc::invalid_argument, "an RPC backend name must not be empty");
    if (!construct_handler)
        return fail(Errc::type_error, "construct_rpc_backend_options_handler of RPC backend " + name + " is empty");
    if (!init_handler) return fail(Errc::type_error, "init_backend_handler of RPC backend " + name + " is empty");
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    auto [it, inserted] = r.backends.try_emplace(name, BackendValue{std::move(construct_handler), std::move(init_handler)});
    if (!inserted) return fail(Errc::already_registered, "RPC backend " + name + " is already registered");
    return BackendTypeFactory::make(std::move(name));
}

Result<BackendType> backend_type(std::string_view name) {
    if (!backend_registered(name)) return unknown_backend(name);
    return BackendTypeFactory::make(std::string(name));
}

std::vector<BackendType> registered_backends() {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    std::vector<BackendType> out;
    out.reserve(r.backends.size());
    for (const auto& [name, value] : r.backends) out.push_back(BackendTypeFactory::make(name));
    return out;
}

Result<BackendValue> backend_value(const BackendRef& backend) { return lookup(backend.name()); }

Result<std::shared_ptr<RpcBackendOptions>> construct_rpc_backend_options(const BackendRef& backend, double rpc_timeout,
                                                                         std::string init_method,
                                                                         const BackendKwargs& kwargs) {
    auto value = lookup(backend.name());
    if (!value) return fail(std::move(value).error());
    Result<std::shared_ptr<RpcBackendOptions>> options = fail(Errc::internal, "");
    try {
        options = value->construct_rpc_backend_options_handler(rpc_timeout, std::move(init_method), kwargs);
    } catch (...) {
        return fail(error_from_current_exception("construct_rpc_backend_options handler of RPC backend " +
                                                         backend.name()));
    }
    if (options && !*options)
        return fail(Errc::internal,
                    "construct_rpc_backend_options handler of RPC backend " + backend.name() + " returned no options");
    return options;
}

Task<Result<std::shared_ptr<RpcAgent>>> init_backend(BackendRef backend, BackendInitArgs args) {
    auto value = lookup(backend.name());
    if (!value) co_return fail(std::move(value).error());
    Result<std::shared_ptr<RpcAgent>> agent = fail(Errc::internal, "");
    try {
        agent = co_await value->init_backend_handler(std::move(args));
    } catch (...) {
        co_return fail(error_from_current_exception("init_backend handler of RPC backend " + backend.name()));
    }
    if (agent && !*agent)
        co_return fail(Errc::internal, "init_backend handler of RPC backend " + backend.name() + " returned no agent");
    co_return agent;
}

}  // namespace tensorplay
