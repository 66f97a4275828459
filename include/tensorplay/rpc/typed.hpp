// Typed RPC: define<R(Args...)>(agent, name, fn) (or define_startup before init) and
// call<R>(agent, to, name, args...) over any
// RpcAgent, with a Codec<T> customization point (arithmetic, strings, vectors, maps, pairs, tensors).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>
#include <tensorplay/core/wire.hpp>
#include <tensorplay/device/tensor.hpp>
#include <tensorplay/rpc/agent.hpp>
#include <tensorplay/rpc/startup.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tensorplay {

/// How a value of type T travels in a Message. Specialise it for your own types:
///   static void encode(WireWriter& w, const T& v, std::vector<Tensor>& tensors);
///   static Result<T> decode(WireReader& r, std::span<const Tensor> tensors);
///   static std::string name();   // optional: shown in type errors and checked on both sides
/// decode must check every length it reads (WireReader does for its own prefixes) and fail with
/// Errc::protocol_error or Errc::type_error, never read out of bounds.
template <class T>
struct Codec;

namespace detail {
template <class T>
concept has_codec_name = requires { { Codec<T>::name() } -> std::convertible_to<std::string>; };

template <class T>
std::string codec_name() {
    if constexpr (has_codec_name<T>) return Codec<T>::name();
    else return "?";
}

inline Error decode_failure(const WireReader& r, std::string_view what) {
    if (r.error()) return *r.error();
    return Error(Errc::protocol_error, "malformed " + std::string(what));
}
}  // namespace detail

/// bool: one byte, 0 or 1 (anything else is a type_error).
template <>
struct Codec<bool> {
    static std::string name() { return "bool"; }
    static void encode(WireWriter& w, bool v, std::vector<Tensor>&) { w.u8(v ? 1 : 0); }
    static Result<bool> decode(WireReader& r, std::span<const Tensor>) {
        const auto b = r.u8();
        if (r.failed()) return fail(detail::decode_failure(r, "bool"));
        if (b > 1) return fail(Errc::type_error, "a bool must be 0 or 1, got " + std::to_string(b));
        return b == 1;
    }
};

/// Integers (fixed width, little-endian) and float/double (IEEE bits).
template <class T>
    requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= 8)
struct Codec<T> {
    static std::string name() {
        if constexpr (std::is_floating_point_v<T>) return "f" + std::to_string(8 * sizeof(T));
        else return (std::is_signed_v<T> ? "i" : "u") + std::to_string(8 * sizeof(T));
    }
    static void encode(WireWriter& w, T v, std::vector<Tensor>&) {
        if constexpr (sizeof(T) == 1) w.u8(std::bit_cast<std::uint8_t>(v));
        else if constexpr (sizeof(T) == 2) w.u16(std::bit_cast<std::uint16_t>(v));
        else if constexpr (sizeof(T) == 4) w.u32(std::bit_cast<std::uint32_t>(v));
        else w.u64(std::bit_cast<std::uint64_t>(v));
    }
    static Result<T> decode(WireReader& r, std::span<const Tensor>) {
        T v;
        if constexpr (sizeof(T) == 1) v = std::bit_cast<T>(r.u8());
        else if constexpr (sizeof(T) == 2) v = std::bit_cast<T>(r.u16());
        else if constexpr (sizeof(T) == 4) v = std::bit_cast<T>(r.u32());
        else v = std::bit_cast<T>(r.u64());
        if (r.failed()) return fail(detail::decode_failure(r, name()));
        return v;
    }
};

/// std::string: u64 length and the bytes.
template <>
struct Codec<std::string> {
    static std::string name() { return "str"; }
    static void encode(WireWriter& w, std::string_view v, std::vector<Tensor>&) { w.str64(v); }
    static Result<std::string> decode(WireReader& r, std::span<const Tensor>) {
        auto s = r.str64(r.remaining(), "string");
        if (r.failed()) return fail(detail::decode_failure(r, "string"));
        return std::string(s);
    }
};

/// Encode-only conveniences so that call(..., "literal") sends a str.
template <>
struct Codec<std::string_view> {
    static std::string name() { return "str"; }
    static void encode(WireWriter& w, std::string_view v, std::vector<Tensor>&) { w.str64(v); }
};
template <>
struct Codec<const char*> {
    static std::string name() { return "str"; }
    static void encode(WireWriter& w, const char* v, std::vector<Tensor>&) { w.str64(v ? v : ""); }
};

/// Tensor: travels in Message::tensors; the payload holds its index (u32).
template <>
struct Codec<Tensor> {
    static std::string name() { return "tensor"; }
    static void encode(WireWriter& w, const Tensor& t, std::vector<Tensor>& tensors) {
        w.u32(static_cast<std::uint32_t>(tensors.size()));
        tensors.push_back(t);
    }
    static Result<Tensor> decode(WireReader& r, std::span<const Tensor> tensors) {
        const auto i = r.u32();
        if (r.failed()) return fail(detail::decode_failure(r, "tensor index"));
        if (i >= tensors.size())
            return fail(Errc::protocol_error, "tensor index " + std::to_string(i) + " but the message carries " +
                                                  std::to_string(tensors.size()) + " tensor(s)");
        return tensors[i];
    }
};

/// std::vector<T>: u64 count then the elements (arithmetic elements as one block).
template <class T, class A>
struct Codec<std::vector<T, A>> {
    static constexpr bool bulk = std::is_arithmetic_v<T> && !std::is_same_v<T, bool> &&
                                 std::endian::native == std::endian::little;
    static std::string name() { return "vec<" + detail::codec_name<T>() + ">"; }
    static void encode(WireWriter& w, const std::vector<T, A>& v, std::vector<Tensor>& tensors) {
        w.u64(v.size());
        if constexpr (bulk) {
            w.raw({reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(T)});
        } else {
            for (const auto& e : v) Codec<T>::encode(w, e, tensors);
        }
    }
    static Result<std::vector<T, A>> decode(WireReader& r, std::span<const Tensor> tensors) {
        const auto n = r.u64();
        if (r.failed()) return fail(detail::decode_failure(r, "vector length"));
        // Every element takes at least one byte, so a count above the bytes left is a lie;
        // checking it first keeps a hostile count from allocating.
        const std::uint64_t min_bytes = bulk ? sizeof(T) : 1;
        if (n > r.remaining() / min_bytes)
            return fail(Errc::protocol_error, "vector of " + std::to_string(n) + " elements but only " +
                                                  std::to_string(r.remaining()) + " bytes left");
        std::vector<T, A> out;
        if constexpr (bulk) {
            auto raw = r.raw(n * sizeof(T), "vector elements");
            if (r.failed()) return fail(detail::decode_failure(r, "vector elements"));
            out.resize(n);
            if (n != 0) std::memcpy(out.data(), raw.data(), raw.size());
        } else {
            // No more than the bytes left could hold: an element larger in memory than its least
            // encoding (a string: 32 bytes for 8) would let a claimed count reserve a multiple of
            // the input; past that, the vector grows as elements actually decode.
            out.reserve(std::min<std::uint64_t>(n, r.remaining() / sizeof(T)));
            for (std::uint64_t i = 0; i < n; ++i) {
                auto e = Codec<T>::decode(r, tensors);
                if (!e) return fail(std::move(e).error().context("vector element " + std::to_string(i)));
                out.push_back(std::move(*e));
            }
        }
        return out;
    }
};

/// std::pair<A, B>: first then second.
template <class A, class B>
struct Codec<std::pair<A, B>> {
    static std::string name() { return "pair<" + detail::codec_name<A>() + "," + detail::codec_name<B>() + ">"; }
    static void encode(WireWriter& w, const std::pair<A, B>& v, std::vector<Tensor>& tensors) {
        Codec<A>::encode(w, v.first, tensors);
        Codec<B>::encode(w, v.second, tensors);
    }
    static Result<std::pair<A, B>> decode(WireReader& r, std::span<const Tensor> tensors) {
        auto a = Codec<A>::decode(r, tensors);
        if (!a) return fail(std::move(a).error());
        auto b = Codec<B>::decode(r, tensors);
        if (!b) return fail(std::move(b).error());
        return std::pair<A, B>(std::move(*a), std::move(*b));
    }
};

/// std::map<K, V>: u64 count then key, value pairs; a repeated key is a protocol_error.
template <class K, class V, class C, class A>
struct Codec<std::map<K, V, C, A>> {
    static std::string name() { return "map<" + detail::codec_name<K>() + "," + detail::codec_name<V>() + ">"; }
    static void encode(WireWriter& w, const std::map<K, V, C, A>& m, std::vector<Tensor>& tensors) {
        w.u64(m.size());
        for (const auto& [k, v] : m) {
            Codec<K>::encode(w, k, tensors);
            Codec<V>::encode(w, v, tensors);
        }
    }
    static Result<std::map<K, V, C, A>> decode(WireReader& r, std::span<const Tensor> tensors) {
        const auto n = r.u64();
        if (r.failed()) return fail(detail::decode_failure(r, "map size"));
        if (n > r.remaining() / 2)
            return fail(Errc::protocol_error, "map of " + std::to_string(n) + " entries but only " +
                                                  std::to_string(r.remaining()) + " bytes left");
        std::map<K, V, C, A> out;
        for (std::uint64_t i = 0; i < n; ++i) {
            auto k = Codec<K>::decode(r, tensors);
            if (!k) return fail(std::move(k).error().context("map key " + std::to_string(i)));
            auto v = Codec<V>::decode(r, tensors);
            if (!v) return fail(std::move(v).error().context("map value " + std::to_string(i)));
            if (!out.emplace(std::move(*k), std::move(*v)).second)
                return fail(Errc::protocol_error, "map entry " + std::to_string(i) + " repeats a key");
        }
        return out;
    }
};

namespace detail {

// Typed payload: u8 version, str64 signature ("(i64,str)" for arguments, the type name for a
// reply), then the values. The signature lets the receiver name both sides of a type mismatch.
inline constexpr std::uint8_t typed_version = 1;
inline constexpr std::size_t max_signature = 4096;

template <class T>
using decayed_t = std::decay_t<std::remove_cvref_t<T>>;
template <class T>
using codec_t = std::conditional_t<std::is_same_v<decayed_t<T>, char*>, const char*, decayed_t<T>>;

template <class... Args>
const std::string& args_signature() {
    static const std::string sig = [] {
        std::string s = "(";
        ((s += codec_name<codec_t<Args>>(), s += ","), ...);
        if (s.size() > 1) s.pop_back();
        return s + ")";
    }();
    return sig;
}

template <class R>
const std::string& reply_signature() {
    static const std::string sig = [] {
        if constexpr (std::is_void_v<R>) return std::string("void");
        else return codec_name<codec_t<R>>();
    }();
    return sig;
}

template <class... Args>
Message encode_args(const Args&... args) {
    Message m;
    WireWriter w;
    w.u8(typed_version).str64(args_signature<Args...>());
    (Codec<codec_t<Args>>::encode(w, args, m.tensors), ...);
    m.payload = std::move(w).take();
    return m;
}

/// Reads the version and signature; a mismatch is a type_error naming both signatures.
inline Result<void> check_header(WireReader& r, const std::string& expected, std::string_view what) {
    const auto version = r.u8();
    auto sig = r.str64(max_signature, "type signature");
    if (r.failed()) return fail(decode_failure(r, what).context(std::string(what)));
    if (version != typed_version)
        return fail(Errc::protocol_error, std::string(what) + ": typed payload version " + std::to_string(version) +
                                              ", expected " + std::to_string(typed_version));
    if (sig != expected)
        return fail(Errc::type_error, std::string(what) + ": expected " + expected + " but got " + std::string(sig));
    return ok();
}

template <class... Args, std::size_t... I>
Result<std::tuple<Args...>> decode_values(WireReader& r, std::span<const Tensor> ts, std::index_sequence<I...>) {
    [[maybe_unused]] auto& tensors = ts;  // unused when there are no arguments
    std::tuple<std::optional<Args>...> parts;
    std::optional<Error> err;
    (
        [&] {
            if (err) return;
            auto v = Codec<Args>::decode(r, tensors);
            if (!v) err = std::move(v).error().context("argument " + std::to_string(I));
            else std::get<I>(parts).emplace(std::move(*v));
        }(),
        ...);
    if (err) return fail(std::move(*err));
    if (auto fin = r.finish(); !fin) return fail(std::move(fin).error().context("after the last argument"));
    return std::tuple<Args...>(std::move(*std::get<I>(parts))...);
}

template <class... Args>
Result<std::tuple<Args...>> decode_args(const Message& m, std::string_view handler) {
    WireReader r(m.payload);
    const std::string what = "arguments of typed handler \"" + std::string(handler) + "\"";
    if (auto h = check_header(r, args_signature<Args...>(), what); !h) return fail(std::move(h).error());
    auto v = decode_values<Args...>(r, m.tensors, std::index_sequence_for<Args...>{});
    if (!v) return fail(std::move(v).error().context(what));
    return v;
}

template <class R>
Message encode_reply(const R* value) {
    Message m;
    WireWriter w;
    w.u8(typed_version).str64(reply_signature<R>());
    if constexpr (!std::is_void_v<R>) Codec<codec_t<R>>::encode(w, *value, m.tensors);
    m.payload = std::move(w).take();
    return m;
}

template <class R>
Result<R> decode_reply(const Message& m, std::string_view handler, std::string_view to) {
    WireReader r(m.payload);
    const std::string what = "reply of \"" + std::string(handler) + "\" from worker \"" + std::string(to) + "\"";
    if (auto h = check_header(r, reply_signature<R>(), what); !h) return fail(std::move(h).error());
    if constexpr (std::is_void_v<R>) {
        if (auto fin = r.finish(); !fin) return fail(std::move(fin).error().context(what));
        return {};
    } else {
        auto v = Codec<codec_t<R>>::decode(r, m.tensors);
        if (!v) return fail(std::move(v).error().context(what));
        if (auto fin = r.finish(); !fin) return fail(std::move(fin).error().context(what));
        return std::move(*v);
    }
}

template <class T> struct result_traits { static constexpr bool is_result = false; using value_type = T; };
template <class T> struct result_traits<tl::expected<T, Error>> { static constexpr bool is_result = true; using value_type = T; };
template <class T> struct task_traits { static constexpr bool is_task = false; using value_type = T; };
template <class T> struct task_traits<Task<T>> { static constexpr bool is_task = true; using value_type = T; };

// Converts what a user function returned (R, Result<R>, void, Result<void>) into a reply.
template <class R, class Out>
Result<Message> to_reply(Out&& out) {
    using O = std::remove_cvref_t<Out>;
    if constexpr (result_traits<O>::is_result) {
        if (!out) return fail(std::forward<Out>(out).error());
        if constexpr (std::is_void_v<R>) return encode_reply<void>(nullptr);
        else {
            const R& v = *out;
            return encode_reply<R>(&v);
        }
    } else if constexpr (std::is_void_v<R>) {
        return encode_reply<void>(nullptr);
    } else {
        const R& v = out;
        return encode_reply<R>(&v);
    }
}

template <class F, class... Args>
decltype(auto) invoke_user(F& fn, const WorkerInfo& caller, std::tuple<Args...>& args) {
    return std::apply(
        [&](auto&... a) -> decltype(auto) {
            if constexpr (std::is_invocable_v<F&, const WorkerInfo&, Args&&...>) return fn(caller, std::move(a)...);
            else return fn(std::move(a)...);
        },
        args);
}

template <class F, class... Args>
using user_result_t = decltype(invoke_user(std::declval<F&>(), std::declval<const WorkerInfo&>(),
                                           std::declval<std::tuple<Args...>&>()));

inline Error handler_exception(std::exception_ptr e, std::string_view handler) {
    const std::string what = "typed handler \"" + std::string(handler) + "\" threw";
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        return Error(Errc::internal, what + ": " + ex.what());
    } catch (...) {
        return Error(Errc::internal, what + " a non-standard exception");
    }
}

template <class R, class F, class... Args>
Result<Message> run_sync(F& fn, std::string_view name, const WorkerInfo& caller, const Message& request) {
    auto args = decode_args<Args...>(request, name);
    if (!args) return fail(std::move(args).error());
    try {
        if constexpr (std::is_void_v<user_result_t<F, Args...>>) {
            invoke_user(fn, caller, *args);
            return encode_reply<void>(nullptr);
        } else {
            return to_reply<R>(invoke_user(fn, caller, *args));
        }
    } catch (...) {
        return fail(handler_exception(std::current_exception(), name));
    }
}

template <class R, class F, class... Args>
Task<Result<Message>> run_coroutine(std::shared_ptr<F> fn, std::string name, WorkerInfo caller, Message request) {
    auto args = decode_args<Args...>(request, name);
    if (!args) co_return fail(std::move(args).error());
    using Inner = typename task_traits<user_result_t<F, Args...>>::value_type;
    std::optional<Error> thrown;
    std::optional<Result<Message>> reply;
    try {
        if constexpr (std::is_void_v<Inner>) {
            co_await invoke_user(*fn, caller, *args);
            reply = encode_reply<void>(nullptr);
        } else {
            reply = to_reply<R>(co_await invoke_user(*fn, caller, *args));
        }
    } catch (...) {
        thrown = handler_exception(std::current_exception(), name);
    }
    if (thrown) co_return fail(std::move(*thrown));
    co_return std::move(*reply);
}

template <class Sig>
struct signature;
template <class R, class... Args>
struct signature<R(Args...)> {
    using result = R;
    using args = std::tuple<std::remove_cvref_t<Args>...>;
};

/// Where define_impl registers: an agent, or the process's startup handlers.
struct AgentRegistrar {
    RpcAgent& agent;
    Result<void> coro(std::string name, RpcHandler h) const { return agent.register_handler(std::move(name), std::move(h)); }
    Result<void> blocking(std::string name, BlockingRpcHandler h) const {
        return agent.register_blocking_handler(std::move(name), std::move(h));
    }
};
struct StartupRegistrar {
    Result<void> coro(std::string name, RpcHandler h) const { return register_startup_handler(std::move(name), std::move(h)); }
    Result<void> blocking(std::string name, BlockingRpcHandler h) const {
        return register_startup_blocking_handler(std::move(name), std::move(h));
    }
};

template <class R, class... Args, class F, class Registrar>
Result<void> define_impl(const Registrar& reg, std::string name, F fn, bool inline_sync, std::tuple<Args...>*) {
    auto shared = std::make_shared<F>(std::move(fn));
    if constexpr (task_traits<user_result_t<F, Args...>>::is_task) {
        return reg.coro(name, [shared, name](WorkerInfo caller, Message request) {
            return run_coroutine<R, F, Args...>(shared, name, std::move(caller), std::move(request));
        });
    } else {
        if (inline_sync) {
            return reg.coro(name, [shared, name](WorkerInfo caller, Message request) -> Task<Result<Message>> {
                co_return run_sync<R, F, Args...>(*shared, name, caller, request);
            });
        }
        return reg.blocking(name, [shared, name](const WorkerInfo& caller, Message request) {
            return run_sync<R, F, Args...>(*shared, name, caller, request);
        });
    }
}

template <class R>
Task<Result<R>> typed_call(RpcAgent& agent, std::string to, std::string name, Message request, double timeout_sec) {
    auto reply = co_await agent.rpc_async(to, name, std::move(request), timeout_sec);
    if (!reply) co_return fail(std::move(reply).error());
    co_return decode_reply<R>(*reply, name, to);
}

}  // namespace detail

/// Registers `fn` under `name` on `agent` as a typed handler with signature `Sig` = R(Args...).
/// `fn` takes (Args...) or (const WorkerInfo& caller, Args...) and returns R, Result<R>,
/// Task<R> or Task<Result<R>>. Coroutine functions run on the agent's I/O executor; plain ones on
/// its pool of worker threads (they may block). Arguments that do not decode give the caller an
/// error naming both signatures; an error or exception from `fn` reaches the caller as
/// remote_error. Errors: already_registered.
template <class Sig, class F>
[[nodiscard]] Result<void> define(RpcAgent& agent, std::string name, F fn) {
    using S = detail::signature<Sig>;
    return detail::define_impl<typename S::result>(detail::AgentRegistrar{agent}, std::move(name), std::move(fn), false,
                                                   static_cast<typename S::args*>(nullptr));
}

/// Like define, but a plain (non-coroutine) `fn` runs on the I/O executor: for short functions
/// that never block (saves the hop to the pool).
template <class Sig, class F>
[[nodiscard]] Result<void> define_inline(RpcAgent& agent, std::string name, F fn) {
    using S = detail::signature<Sig>;
    return detail::define_impl<typename S::result>(detail::AgentRegistrar{agent}, std::move(name), std::move(fn), true,
                                                   static_cast<typename S::args*>(nullptr));
}

/// define for every agent this process starts from now on: a typed startup handler (see
/// register_startup_handler), installed before the agent reports ready, so that no peer's first
/// call can find it missing. Register before init_rpc. Errors: already_registered. Thread-safe.
template <class Sig, class F>
[[nodiscard]] Result<void> define_startup(std::string name, F fn) {
    using S = detail::signature<Sig>;
    return detail::define_impl<typename S::result>(detail::StartupRegistrar{}, std::move(name), std::move(fn), false,
                                                   static_cast<typename S::args*>(nullptr));
}

/// define_startup with define_inline's rule: a plain `fn` runs on the I/O executor.
template <class Sig, class F>
[[nodiscard]] Result<void> define_startup_inline(std::string name, F fn) {
    using S = detail::signature<Sig>;
    return detail::define_impl<typename S::result>(detail::StartupRegistrar{}, std::move(name), std::move(fn), true,
                                                   static_cast<typename S::args*>(nullptr));
}

/// Calls typed handler `name` on worker `to` with `args` and decodes its R. The argument types
/// (after decay; a string literal counts as std::string) must match the handler's signature,
/// else Errc::remote_error naming both. Other errors as RpcAgent::rpc_async. The agent must
/// outlive the returned task.
template <class R, class... Args>
[[nodiscard]] Task<Result<R>> call(RpcAgent& agent, std::string to, std::string name, Args... args) {
    return detail::typed_call<R>(agent, std::move(to), std::move(name), detail::encode_args<Args...>(args...), -1.0);
}

/// call with a timeout in seconds (0: none; UNSET_RPC_TIMEOUT: the agent's default).
template <class R, class... Args>
[[nodiscard]] Task<Result<R>> call_with_timeout(RpcAgent& agent, double timeout_sec, std::string to,
                                                std::string name, Args... args) {
    return detail::typed_call<R>(agent, std::move(to), std::move(name), detail::encode_args<Args...>(args...),
                                 timeout_sec);
}

}  // namespace tensorplay
