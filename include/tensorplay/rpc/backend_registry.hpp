// The backend registry: named RPC backends whose options handlers build options and whose
// init handlers are coroutines that produce an RpcAgent. TENSORPIPE is registered built in.
#pragma once

#include <tensorplay/core/export.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/device/device.hpp>
#include <tensorplay/device/device_map.hpp>
#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/constants.hpp>
#include <tensorplay/rpc/options.hpp>
#include <tensorplay/store/store.hpp>

#include <compare>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tensorplay {

/// What an init handler is given (the seed's store=, name=, rank=, world_size=, rpc_backend_options=).
/// Not an aggregate on purpose: GCC 12 destroys a braced aggregate temporary twice when it is a
/// coroutine argument inside a co_await expression; with constructors `co_await init_backend(b, {...})` is safe.
struct TP_API BackendInitArgs {
    BackendInitArgs() = default;
    BackendInitArgs(std::shared_ptr<Store> store_, std::string name_, int rank_, int world_size_,
                    std::shared_ptr<RpcBackendOptions> options_)
        : store(std::move(store_)), name(std::move(name_)), rank(rank_), world_size(world_size_),
          options(std::move(options_)) {}

    std::shared_ptr<Store> store;
    std::string name;
    int rank = -1;
    int world_size = -1;
    std::shared_ptr<RpcBackendOptions> options;
};

/// One keyword argument of construct_rpc_backend_options; std::monostate stands for Python's None.
using BackendKwarg = std::variant<std::monostate, bool, std::int64_t, double, std::string, std::vector<std::string>,
                                  std::vector<Device>, DeviceMaps>;
/// Keyword arguments by name (the seed's **kwargs).
using BackendKwargs = std::map<std::string, BackendKwarg, std::less<>>;
/// Python-style name of the type a kwarg holds: "None", "bool", "int", "float", "str", "list[str]", ...
[[nodiscard]] TP_API std::string_view kwarg_type_name(const BackendKwarg& value) noexcept;

/// Builds a backend's options from a timeout (seconds), an init method and keyword arguments.
using ConstructRpcBackendOptionsHandler = std::function<Result<std::shared_ptr<RpcBackendOptions>>(
    double rpc_timeout, std::string init_method, const BackendKwargs& kwargs)>;
/// Starts a backend: a coroutine producing this worker's agent.
using InitBackendHandler = std::function<Task<Result<std::shared_ptr<RpcAgent>>>(BackendInitArgs args)>;

/// The two handlers of a registered backend (the seed's BackendValue).
struct TP_API BackendValue {
    ConstructRpcBackendOptionsHandler construct_rpc_backend_options_handler;
    InitBackendHandler init_backend_handler;
};

/// A handle naming a registered backend; only the registry makes them, so each names one that exists.
/// Printable as "BackendType.NAME"; ordered and compared by name.
class TP_API BackendType {
public:
    /// The built-in TENSORPIPE backend (the seed's BackendType.TENSORPIPE).
    [[nodiscard]] static BackendType tensorpipe();

    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    /// "BackendType.NAME".
    [[nodiscard]] std::string str() const { return "BackendType." + name_; }

    friend bool operator==(const BackendType&, const BackendType&) = default;
    friend auto operator<=>(const BackendType&, const BackendType&) = default;

private:
    friend struct BackendTypeFactory;
    explicit BackendType(std::string name) : name_(std::move(name)) {}
    std::string name_;
};

TP_API std::ostream& operator<<(std::ostream& os, const BackendType& b);

/// A backend given either as a BackendType or by name (the seed accepts both).
class TP_API BackendRef {
public:
    BackendRef(const BackendType& backend) : name_(backend.name()) {}  // NOLINT: implicit by design
    BackendRef(std::string name) : name_(std::move(name)) {}          // NOLINT
    BackendRef(std::string_view name) : name_(name) {}                // NOLINT
    BackendRef(const char* name) : name_(name) {}                     // NOLINT
    [[nodiscard]] const std::string& name() const noexcept { return name_; }

private:
    std::string name_;
};

/// True when a backend is registered under `name`. Thread-safe.
[[nodiscard]] TP_API bool backend_registered(std::string_view name);

/// Registers a backend. Errc::already_registered ("RPC backend NAME is already registered") when the name
/// is taken; Errc::invalid_argument for an empty name; Errc::type_error for an empty handler. Thread-safe.
[[nodiscard]] TP_API Result<BackendType> register_backend(std::string name,
                                                   ConstructRpcBackendOptionsHandler construct_rpc_backend_options_handler,
                                                   InitBackendHandler init_backend_handler);

/// The handle of a registered backend (the seed's BackendType[name]); Errc::unknown_backend otherwise.
[[nodiscard]] TP_API Result<BackendType> backend_type(std::string_view name);
/// Every registered backend, in name order.
[[nodiscard]] TP_API std::vector<BackendType> registered_backends();
/// The handlers of a backend (the seed's BackendType.X.value); Errc::unknown_backend when unknown.
[[nodiscard]] TP_API Result<BackendValue> backend_value(const BackendRef& backend);

/// Calls the backend's options handler. Errc::unknown_backend ("unknown RPC backend 'NAME'") for an
/// unknown name; otherwise what the handler returns (a handler's exception becomes Errc::internal).
[[nodiscard]] TP_API Result<std::shared_ptr<RpcBackendOptions>> construct_rpc_backend_options(
    const BackendRef& backend, double rpc_timeout = DEFAULT_RPC_TIMEOUT_SEC,
    std::string init_method = std::string(DEFAULT_INIT_METHOD), const BackendKwargs& kwargs = {});

/// Awaits the backend's init handler. Errc::unknown_backend for an unknown name; otherwise the handler's
/// result (its exception becomes Errc::internal; a success without an agent is Errc::internal).
/// Cancellation is forwarded to the handler.
[[nodiscard]] TP_API Task<Result<std::shared_ptr<RpcAgent>>> init_backend(BackendRef backend, BackendInitArgs args);

}  // namespace tensorplay
