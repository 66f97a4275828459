// TcpStore client, connection setup: connecting with retries and back-off, the dialect handshake
// (VALIDATE, or the torch 1.13 probe), and progress logs while the store is not up yet.
#include "store/tcp_store_client_impl.hpp"

#include "core/asio_compat.hpp"
#include "core/resolve.hpp"

#include <tensorplay/core/log.hpp>

#include <asio/steady_timer.hpp>

#include <algorithm>
#include <cstdlib>
#include <random>

namespace tensorplay::detail {

namespace {

constexpr Duration kHandshakeLimit = std::chrono::seconds(10);  // a store answers in microseconds
constexpr Duration kProgressEvery = std::chrono::seconds(3);

// What went wrong, without the context a caller adds ("connecting to the store at H:P").
std::string reason(const Error& e) { return e.cause() ? e.cause().message() : e.message(); }

std::string secs_string(Duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

// TP_STORE_DIALECT, consulted when the options leave the dialect to detection: nothing = detect.
Result<std::optional<c10d::Dialect>> dialect_from_env() {
    const char* v = std::getenv("TP_STORE_DIALECT");
    const std::string_view s = v ? v : "";
    if (s.empty() || s == "auto") return std::optional<c10d::Dialect>{};
    if (s == "torch2") return std::optional<c10d::Dialect>(c10d::Dialect::modern);
    if (s == "torch113") return std::optional<c10d::Dialect>(c10d::Dialect::legacy);
    return fail(Errc::invalid_argument,
                "TP_STORE_DIALECT must be auto, torch2 or torch113, got \"" + std::string(s) + "\"");
}

Task<Result<void>> send_and_fill(Lane* lane, Bytes bytes, std::size_t want, std::string where) {
    if (auto r = co_await write_all(lane, &bytes, where); !r) co_return r;
    co_return co_await fill(lane, want, &where);
}

Duration attempt_limit(Clock::time_point deadline) {
    return std::clamp<Duration>(deadline - Clock::now(), std::chrono::seconds(1), kHandshakeLimit);
}

}  // namespace

Task<Result<void>> ClientState::handshake(Lane& lane, Duration limit) {
    static std::uint32_t counter = 0;
    // Bit 23 is set so that a PyTorch 1.13 server drops the connection at once: it reads VALIDATE
    // as SET, and the magic, PING's type byte and the nonce's low three bytes as the key's u64
    // length, whose top byte is then >= 0x80: a length it cannot allocate (instead of one it would
    // allocate, zero-fill and then wait for).
    const std::uint32_t nonce = (static_cast<std::uint32_t>(::getpid()) * 2654435761u + ++counter) | 0x00800000u;
    Bytes hello;
    c10d::put_u8(hello, *c10d::encode_type(c10d::Dialect::modern, c10d::Op::validate));
    c10d::put_u32(hello, c10d::kValidationMagic);
    c10d::put_u8(hello, *c10d::encode_type(c10d::Dialect::modern, c10d::Op::ping));
    c10d::put_u32(hello, nonce);
    auto h = co_await with_timeout(send_and_fill(&lane, std::move(hello), 4, where), limit);
    if (!h) {
        const Error& e = h.error();
        if (e.code() == Errc::timeout)
            co_return fail(Errc::timeout, "the listener accepted the connection but did not answer the store handshake "
                                          "(VALIDATE, PING) within " + ms_string(limit) +
                                              ": not a tensorplay/c10d store (or one too busy to answer)");
        if (e.code() == Errc::connection_lost)
            co_return fail(Error(Errc::connection_lost, "the server closed the connection on the store handshake "
                                                        "(VALIDATE, PING): " + reason(e), {}, e.cause()));
        co_return fail(e);
    }
    const auto echoed = c10d::get_u32(lane.in.data() + lane.in_begin);
    lane.in_begin += 4;
    if (echoed != nonce)
        co_return fail(Errc::protocol_error, "the listener answered the store handshake's PING with " +
                                                 std::to_string(echoed) + " instead of " + std::to_string(nonce) +
                                                 ": not a tensorplay/c10d store");
    co_return ok();
}

Task<Result<void>> ClientState::probe_legacy(Lane& lane, Duration limit) {
    Bytes request;
    c10d::put_u8(request, *c10d::encode_type(c10d::Dialect::legacy, c10d::Op::num_keys));
    auto r = co_await with_timeout(send_and_fill(&lane, std::move(request), 8, where), limit);
    if (!r) co_return fail(Errc::protocol_error, "the listener closed the connection on the torch2 handshake (VALIDATE) and did "
                                                 "not answer a PyTorch 1.13 GETNUMKEYS either (" + reason(r.error()) +
                                                     "): it may be full (TcpStoreServerOptions::max_connections or "
                                                     "max_connections_per_host), or not a tensorplay/c10d store");
    const auto n = static_cast<std::int64_t>(c10d::get_u64(lane.in.data() + lane.in_begin));
    const bool extra = lane.in_end - lane.in_begin > 8;
    lane.in_begin = lane.in_end = 0;
    if (n < 0 || extra)
        co_return fail(Errc::protocol_error, "the listener answered a PyTorch 1.13 GETNUMKEYS with " + std::to_string(n) +
                                                 ": not a tensorplay/c10d store");
    co_return ok();
}

Task<Result<void>> ClientState::open(Lane& lane, Clock::time_point deadline, bool retry) {
    bool detect = false;
    if (!dialect_settled && options.dialect == TcpStoreDialect::automatic) {
        auto forced = dialect_from_env();
        if (!forced) co_return fail(forced.error());
        detect = !*forced;
        dialect = forced->value_or(c10d::Dialect::modern);
    }
    asio::steady_timer sleep(strand);
    std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                            static_cast<unsigned>(Clock::now().time_since_epoch().count()));
    Duration backoff = std::chrono::milliseconds(10);
    const auto started = Clock::now();
    auto next_progress = started + kProgressEvery;
    int attempts = 0;
    Error last(Errc::timeout, "no attempt made");
    for (;;) {
        if (closed) co_return fail(Errc::shutdown, "the store client was closed while connecting to " + where);
        // (not Asio's resolver: its thread would stay for the event loop's life; see resolve.hpp)
        auto resolved = co_await resolve_host(options.host, options.port);
        if (!resolved)  // a name that does not resolve will not start resolving by waiting: say so now
            co_return fail(Errc::invalid_argument, "the store's host \"" + options.host + "\" does not resolve (" +
                                                       resolved.error().message() + ")");
        ++attempts;
        for (const auto& endpoint : *resolved) {
            const auto remaining = deadline - Clock::now();
            if (remaining <= Duration::zero()) break;
            asio::ip::tcp::socket candidate(strand);
            auto r = co_await with_timeout(connect_once(&candidate, endpoint), remaining);
            if (!r) {
                last = std::move(r).error();
                continue;
            }
            std::error_code ignored;
            candidate.set_option(asio::ip::tcp::no_delay(true), ignored);
            lane.socket.close(ignored);
            lane.socket = std::move(candidate);
            lane.in_begin = lane.in_end = 0;
            if (dialect == c10d::Dialect::legacy) {
                dialect_settled = true;
                co_return ok();
            }
            auto h = co_await handshake(lane, attempt_limit(deadline));
            if (h) {
                dialect_settled = true;
                co_return ok();
            }
            // A PyTorch 1.13/2.0 store has no VALIDATE and drops the connection without a byte.
            if (h.error().code() != Errc::connection_lost || lane.in_end != 0) co_return h;
            if (!detect)
                co_return fail(std::move(h).error().context(
                    "the torch2 dialect was asked for, but a PyTorch 1.13/2.0 store closes the connection so "
                    "(use TcpStoreDialect::automatic or torch113; TP_STORE_DIALECT=auto)"));
            asio::ip::tcp::socket again(strand);
            if (auto c = co_await with_timeout(connect_once(&again, endpoint), attempt_limit(deadline)); !c)
                co_return fail(std::move(c).error().context("reconnecting in the PyTorch 1.13 dialect"));
            again.set_option(asio::ip::tcp::no_delay(true), ignored);
            lane.socket.close(ignored);
            lane.socket = std::move(again);
            lane.in_begin = lane.in_end = 0;
            if (auto p = co_await probe_legacy(lane, attempt_limit(deadline)); !p) co_return p;
            dialect = c10d::Dialect::legacy;
            dialect_settled = true;
            log(LogLevel::info, "store", "the store at " + where + " speaks the PyTorch 1.13/2.0 dialect (it closed "
                                         "the connection on VALIDATE): using it (TP_STORE_DIALECT overrides)");
            co_return ok();
        }
        const auto now = Clock::now();
        if (!retry || now + backoff >= deadline)
            co_return fail(retry ? Errc::timeout : last.code(),
                           "no store accepted a connection within " + ms_string(now - started) + " (" +
                               std::to_string(attempts) + (attempts == 1 ? " attempt" : " attempts") +
                               "; last: " + reason(last) + ")");
        if (now >= next_progress) {
            next_progress = now + kProgressEvery;
            log(LogLevel::info, "store", "waiting for the store at " + where + " to accept connections (" +
                                             reason(last) + "; " + secs_string(now - started) + " so far, giving up after " +
                                             secs_string(deadline - started) + ")");
        }
        sleep.expires_after(backoff + std::chrono::milliseconds(jitter() % 10));
        co_await sleep.async_wait(use_nothrow);
        backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(1));
    }
}

}  // namespace tensorplay::detail
