// Connection: the handshake, both sides (docs/protocol.md, "Handshake"): hellos, the version
// check, and with a shared key the mutual challenge-response; then the server's verdict.
#include <tensorplay/transport/connection.hpp>

#include <tensorplay/core/log.hpp>

#include "core/asio_compat.hpp"
#include "core/resolve.hpp"
#include "transport/auth.hpp"
#include "transport/channels/channel.hpp"
#include "transport/connection_state.hpp"
#include "transport/negotiate.hpp"
#include "transport/transport.hpp"

#include <asio/write.hpp>

namespace tensorplay::detail {

// The exchange (each arrow one write; the server answers every hello, even a refused one, so
// that the client learns why):
//
//   without a key on either side        with a key on both sides (version 7)
//   C -> S  hello (offers)               C -> S  hello (name and rank only, client nonce)
//   S -> C  hello (offers, answer |      S -> C  hello (name and rank only, server nonce, proof |
//                  refused)                             refused)
//                                        C -> S  record (proof | refused)
//                                        S -> C  record (accepted | refused)
//                                        C -> S  hello (offers, MAC)
//                                        S -> C  hello (offers, answer, MAC)
//
// (then, when the answer chose a channel that the client checks, its verdict record). With a key,
// nothing a peer could use to reach us on this host (same-host addresses, channel identities)
// goes out before the peer has proven the key: the proofs cover the names, ranks and nonces, and
// each side's offers travel after them under a MAC (an HMAC under the key of the transcript so
// far and the offers, with a label of their own), so that an on-path peer cannot rewrite them.
// A key on one side only is refused by the server (and by the client, should a server admit it).
// Each proof is an HMAC-SHA256 under the key of the transcript and a direction label, so that
// neither side's proof serves as the other's and a recorded client's proof fails against the
// server's next nonce. Refusal reasons are written for the client's error message ("we" is the
// client); nothing secret is ever put in a message.

namespace {

/// Writes `bytes` whole. (References, not values: a coroutine's by-value argument built inside a
/// co_await expression is destroyed twice by GCC 12; callers pass named locals.)
Task<Result<void>> write_all(ConnectionState& s, const Bytes& bytes) {
    s.wrote_last = true;
    if (s.polled) {
        std::vector<asio::const_buffer> b(1, asio::buffer(bytes));
        auto w = co_await s.polled_write(b);
        if (!w) co_return fail(std::move(w).error().context("sending the handshake to " + s.endpoint));
        co_return ok();
    }
    auto [ec, n] = co_await asio::async_write(s.socket, asio::buffer(bytes), use_nothrow);
    if (ec) co_return fail(from_error_code(ec, "sending the handshake to " + s.endpoint));
    co_return ok();
}

Result<void> check_version(const HelloPrefix& p) {
    if (p.version != kProtocolVersion)
        return fail(Errc::protocol_error, "peer speaks protocol version " + std::to_string(p.version) +
                                              ", this side speaks version " + std::to_string(kProtocolVersion) +
                                              " (run the same tensorplay-rpc release on every worker)");
    return ok();
}

/// "peer "name" (rank r) at ip:port": a server's words for a client not yet admitted.
std::string claimed(const HelloInfo& h, const std::string& endpoint) {
    return "peer \"" + h.name + "\" (rank " + std::to_string(h.rank) + ") at " + endpoint;
}

/// Reads a hello's prefix (checking its magic and length, not its version) off the socket.
Task<Result<HelloPrefix>> read_prefix(ConnectionState& s) {
    s.wrote_last = false;
    if (auto r = co_await s.fill(kHelloPrefixSize); !r) co_return fail(r.error());
    auto p = decode_hello_prefix({s.rbuf.data() + s.rbeg, kHelloPrefixSize});
    if (!p) co_return fail(p.error());
    s.rbeg += kHelloPrefixSize;
    co_return *p;
}

/// Reads a whole hello of this version (prefix, version check, body) off the socket.
Task<Result<Hello>> read_hello(ConnectionState& s) {
    auto p = co_await read_prefix(s);
    if (!p) co_return fail(p.error());
    if (auto v = check_version(*p); !v) co_return fail(v.error());
    if (auto r = co_await s.fill(p->body_len); !r) co_return fail(r.error());
    co_return s.parse_hello_body(p->body_len);
}

/// A hello that says who the side is and nothing more (no offers): what a keyed side sends before
/// the key is proven, and what a refusal carries.
Hello bare_hello(const HelloInfo& info) {
    Hello bare;
    bare.info.name = info.name;
    bare.info.rank = info.rank;
    bare.info.transports.clear();
    bare.info.channels.clear();
    return bare;
}

/// Whether a hello names offers or an answer (which a keyed side sends only after the proofs).
bool reveals(const Hello& h) { return !h.info.transports.empty() || !h.info.channels.empty() || h.answer.has_value(); }

/// Reads one handshake record (header, then the body it announces, both bounded).
Task<Result<AuthRecord>> read_record(ConnectionState& s) {
    s.wrote_last = false;
    if (auto r = co_await s.fill(kAuthRecordHeaderSize); !r) co_return fail(r.error());
    auto len = decode_auth_record_header({s.rbuf.data() + s.rbeg, kAuthRecordHeaderSize});
    if (!len) co_return fail(len.error());
    const std::size_t total = kAuthRecordHeaderSize + *len;
    if (auto r = co_await s.fill(total); !r) co_return fail(r.error());
    auto rec = decode_auth_record({s.rbuf.data() + s.rbeg, total});
    s.rbeg += total;
    co_return rec;
}

Task<Result<void>> send_record(ConnectionState& s, AuthRecordKind kind, const std::string& reason) {
    AuthRecord rec;
    rec.kind = kind;
    rec.reason = reason;
    const Bytes out = encode_auth_record(rec);
    co_return co_await write_all(s, out);
}

/// The client's check of the server's answer (docs/protocol.md, "Negotiation"): the same choice,
/// computed from both hellos. A server without an answer found no common transport: the same
/// computation says so, naming both workers.
Result<Negotiated> check_answer(const Hello& theirs, const HelloInfo& mine, const std::string& current, const std::string& who) {
    auto expected = negotiate(theirs.info, mine, current);
    if (!theirs.answer) {
        if (!expected) return fail(expected.error());
        return fail(Errc::protocol_error, who + " sent no negotiation answer although " + expected->transport + " is common");
    }
    if (!expected || !(*expected == *theirs.answer))
        return fail(Errc::protocol_error, who + " answered the negotiation with transport \"" + theirs.answer->transport +
                                              "\", which this side does not choose from the same offers" +
                                              (expected ? " (it chooses \"" + expected->transport + "\")" : std::string()));
    return *theirs.answer;
}

/// The server's side of the channel verdict (docs/protocol.md, "Channels"): after an answer that
/// chose a channel the client must check, it says whether it can use it with us; if not, the pairs
/// fall back to the next channel, as both sides compute it (s.negotiated is updated).
Task<Result<void>> read_verdict(ConnectionState& s, const HelloInfo& server, const HelloInfo& client, const std::string& peer) {
    auto rec = co_await read_record(s);
    if (!rec) co_return fail(rec.error());
    if (rec->kind != AuthRecordKind::channels)
        co_return fail(Errc::protocol_error, peer + " did not send its channel verdict after our answer");
    if (rec->readable) co_return ok();
    log(LogLevel::debug, "transport", peer + " cannot use the channel our answer chose: falling back to the next one");
    auto fallback = negotiate(without_checked_channels(server), client, s.transport);
    if (!fallback) co_return fail(fallback.error());
    s.negotiated = std::move(*fallback);
    co_return ok();
}

/// The client's side: checks the channel the answer chose with the server (cma: its identities and a
/// live probe of its memory), sends the verdict and, when it cannot use it, falls back as the server will.
Task<Result<void>> send_verdict(ConnectionState& s, const HelloInfo& client, const HelloInfo& server) {
    AuthRecord rec;
    rec.kind = AuthRecordKind::channels;
    rec.readable = channel_verdict(client, server, s.socket.native_handle(), s.peer_pid);
    const Bytes out = encode_auth_record(rec);
    if (auto w = co_await write_all(s, out); !w) co_return fail(w.error());
    if (rec.readable) co_return ok();
    auto fallback = negotiate(without_checked_channels(server), client, s.transport);
    if (!fallback) co_return fail(fallback.error());
    s.negotiated = std::move(*fallback);
    co_return ok();
}

/// Answers a hello with a refusal (`mine` with step refused): every refusal answers first, so
/// that the client can say what went wrong.
/// A refusal says who refuses and why, nothing more: a peer that is refused (one without the key,
/// say) learns none of our transports' addresses, channel offers, pid or memory addresses.
Task<void> refuse(ConnectionState& s, const Hello& mine, const std::string& reason) {
    Hello bare = bare_hello(mine.info);
    bare.step = HelloStep::refused;
    bare.reason = reason;
    const Bytes out = encode_hello(bare);
    (void)co_await write_all(s, out);
}

}  // namespace

Task<Result<HelloInfo>> client_handshake(std::shared_ptr<ConnectionState> s, HelloInfo local) {
    const HandshakeAuth& auth = s->auth;
    const bool keyed = !auth.key.empty();
    Hello mine;
    mine.info = std::move(local);
    prepare_channel_offers(mine.info);
    // With a key, the first hello says who we are and nothing more: the offers follow the proofs.
    Hello first = mine;
    if (keyed) {
        auto n = make_nonce();
        if (!n) co_return fail(n.error());
        first = bare_hello(mine.info);
        mine.auth = first.auth = HelloAuth::hmac_sha256;
        mine.nonce = first.nonce = *n;
    }
    const Bytes hello = encode_hello(first);
    if (auto w = co_await write_all(*s, hello); !w) co_return fail(w.error());
    auto theirs = co_await read_hello(*s);
    if (!theirs) co_return fail(theirs.error());
    const std::string who = "worker \"" + theirs->info.name + "\" at " + s->endpoint;
    if (theirs->step == HelloStep::refused)
        co_return fail(Errc::unauthorized, who + " refused the connection: " + theirs->reason, theirs->info.name);
    if (theirs->step == HelloStep::offers)
        co_return fail(Errc::protocol_error, who + " sent its offers before any proof of the key", theirs->info.name);
    if (!keyed) {
        if (theirs->step == HelloStep::proof)
            co_return fail(Errc::unauthorized,
                           who + " requires authentication and we have no shared key: set the same TP_RPC_AUTH_KEY (or "
                                 "TP_RPC_AUTH_KEY_FILE) on every worker",
                           theirs->info.name);
        auto answer = check_answer(*theirs, mine.info, s->transport, who);
        if (!answer) co_return fail(std::move(answer).error().on_worker(theirs->info.name));
        s->negotiated = std::move(*answer);
        if (channel_verdict_needed(s->negotiated))
            if (auto v = co_await send_verdict(*s, mine.info, theirs->info); !v) co_return fail(v.error());
        co_return std::move(theirs->info);
    }
    if (theirs->step == HelloStep::done)
        co_return fail(Errc::unauthorized,
                       who + " does not authenticate (it has no shared key) and we have one: set the same "
                             "TP_RPC_AUTH_KEY on every worker, or on none",
                       theirs->info.name);
    if (reveals(*theirs))
        co_return fail(Errc::protocol_error, who + " named its offers before the key was proven", theirs->info.name);
    // The proofs cover who both sides are and both nonces.
    const Transcript t{kProtocolVersion, &first.info, &theirs->info, mine.nonce, theirs->nonce, nullptr};
    auto expected = handshake_proof(auth.key, t, ProofBy::server);
    if (!expected) co_return fail(expected.error());
    if (!same_proof(*expected, theirs->proof)) {
        // Tell the server, so that its log names the problem too; the connection ends either way.
        const std::string why = "it sent a wrong proof of the shared key: do both sides use the same TP_RPC_AUTH_KEY?";
        (void)co_await send_record(*s, AuthRecordKind::refused, why);
        co_return fail(Errc::unauthorized,
                       who + " sent a wrong proof of the shared key: do both sides use the same TP_RPC_AUTH_KEY?",
                       theirs->info.name);
    }
    auto ours = handshake_proof(auth.key, t, ProofBy::client);
    if (!ours) co_return fail(ours.error());
    AuthRecord proof;
    proof.kind = AuthRecordKind::proof;
    proof.proof = *ours;
    const Bytes record = encode_auth_record(proof);
    if (auto w = co_await write_all(*s, record); !w) co_return fail(w.error());
    auto verdict = co_await read_record(*s);
    if (!verdict) co_return fail(verdict.error());
    if (verdict->kind == AuthRecordKind::refused)
        co_return fail(Errc::unauthorized, who + " refused the connection: " + verdict->reason, theirs->info.name);
    if (verdict->kind != AuthRecordKind::accepted)
        co_return fail(Errc::protocol_error, who + " answered our proof with another proof");

    // Both keys are proven: the offers, each side's under a MAC.
    Hello offers = mine;
    offers.step = HelloStep::offers;
    const Transcript offered{kProtocolVersion, &mine.info, &theirs->info, mine.nonce, theirs->nonce, nullptr};
    auto mac = handshake_proof(auth.key, offered, ProofBy::client_offers);
    if (!mac) co_return fail(mac.error());
    offers.proof = *mac;
    const Bytes offers_bytes = encode_hello(offers);
    if (auto w = co_await write_all(*s, offers_bytes); !w) co_return fail(w.error());
    auto reply = co_await read_hello(*s);
    if (!reply) co_return fail(reply.error());
    if (reply->step == HelloStep::refused)
        co_return fail(Errc::unauthorized, who + " refused the connection: " + reply->reason, theirs->info.name);
    if (reply->step != HelloStep::offers)
        co_return fail(Errc::protocol_error, who + " answered our offers without its own", theirs->info.name);
    if (reply->info.name != theirs->info.name || reply->info.rank != theirs->info.rank)
        co_return fail(Errc::protocol_error, who + " changed its name or rank after the proofs", theirs->info.name);
    const Transcript answered{kProtocolVersion, &mine.info, &reply->info, mine.nonce, theirs->nonce,
                              reply->answer ? &*reply->answer : nullptr};
    auto expected_mac = handshake_proof(auth.key, answered, ProofBy::server_offers);
    if (!expected_mac) co_return fail(expected_mac.error());
    if (!same_proof(*expected_mac, reply->proof))
        co_return fail(Errc::unauthorized, who + " sent offers under a wrong MAC (changed on the way?)", theirs->info.name);
    auto answer = check_answer(*reply, mine.info, s->transport, who);
    if (!answer) co_return fail(std::move(answer).error().on_worker(theirs->info.name));
    s->negotiated = std::move(*answer);
    if (channel_verdict_needed(s->negotiated))
        if (auto v = co_await send_verdict(*s, mine.info, reply->info); !v) co_return fail(v.error());
    co_return std::move(reply->info);
}

Task<Result<HelloInfo>> server_handshake(std::shared_ptr<ConnectionState> s, HelloInfo local) {
    const HandshakeAuth& auth = s->auth;
    auto p = co_await read_prefix(*s);
    if (!p) co_return fail(p.error());
    if (auto r = co_await s->fill(p->body_len); !r) co_return fail(r.error());
    // (A hello of another version is not decoded: only its prefix is known to be readable.)
    Hello mine;
    mine.info = std::move(local);
    prepare_channel_offers(mine.info);
    if (auto v = check_version(*p); !v) {
        const std::string why = "it speaks protocol version " + std::to_string(kProtocolVersion);
        co_await refuse(*s, mine, why);
        co_return fail(v.error());
    }
    auto theirs = s->parse_hello_body(p->body_len);
    if (!theirs) {
        const std::string why = "it could not decode our hello: " + theirs.error().message();
        co_await refuse(*s, mine, why);
        co_return fail(theirs.error());
    }
    const std::string peer = claimed(theirs->info, s->endpoint);
    if (theirs->step != HelloStep::done) {
        const std::string why = "our hello names a server's step";
        co_await refuse(*s, mine, why);
        co_return fail(Errc::protocol_error, peer + " sent a hello with a server's step");
    }
    const bool keyed = !auth.key.empty();
    if (keyed && theirs->auth == HelloAuth::none) {
        const std::string why = "it requires authentication and we have no shared key: set the same TP_RPC_AUTH_KEY (or "
                                "TP_RPC_AUTH_KEY_FILE) on every worker";
        co_await refuse(*s, mine, why);
        co_return fail(Errc::unauthorized, peer + " has no shared key and this worker requires one: set the same "
                                                  "TP_RPC_AUTH_KEY on every worker");
    }
    if (!keyed && theirs->auth != HelloAuth::none) {
        const std::string why = "it has no shared key and we have one: set the same TP_RPC_AUTH_KEY on every worker, or on none";
        co_await refuse(*s, mine, why);
        co_return fail(Errc::unauthorized, peer + " authenticates with a shared key and this worker has none: set the "
                                                  "same TP_RPC_AUTH_KEY on every worker, or on none");
    }
    if (!keyed) {
        // (A channel that needs a check is offered only to a peer this side can use it with.)
        mine.info = channel_offers_for(std::move(mine.info), theirs->info, s->socket.native_handle(), s->peer_pid);
        // The server decides; a hello without an answer tells the client that nothing is common.
        auto chosen = negotiate(mine.info, theirs->info, s->transport);
        if (!chosen) {
            const Bytes hello = encode_hello(mine);
            (void)co_await write_all(*s, hello);
            co_return fail(chosen.error());
        }
        s->negotiated = *chosen;
        mine.answer = std::move(*chosen);
        if (auth.admit)
            if (auto a = auth.admit(theirs->info); !a) {
                co_await refuse(*s, mine, a.error().message());
                co_return fail(Errc::unauthorized, peer + " is refused: " + a.error().message());
            }
        const Bytes hello = encode_hello(mine);
        if (auto w = co_await write_all(*s, hello); !w) co_return fail(w.error());
        if (channel_verdict_needed(s->negotiated))
            if (auto v = co_await read_verdict(*s, mine.info, theirs->info, peer); !v) co_return fail(v.error());
        co_return std::move(theirs->info);
    }
    if (reveals(*theirs)) {
        const std::string why = "our hello named our offers before the key was proven";
        co_await refuse(*s, mine, why);
        co_return fail(Errc::protocol_error, peer + " sent its offers before proving the shared key");
    }
    // The proofs cover who both sides are and both nonces; our offers wait for the client's proof.
    auto n = make_nonce();
    if (!n) co_return fail(n.error());
    Hello first = bare_hello(mine.info);
    first.auth = mine.auth = HelloAuth::hmac_sha256;
    first.nonce = mine.nonce = *n;
    const Transcript t{kProtocolVersion, &theirs->info, &first.info, theirs->nonce, first.nonce, nullptr};
    auto ours = handshake_proof(auth.key, t, ProofBy::server);
    if (!ours) co_return fail(ours.error());
    first.step = HelloStep::proof;
    first.proof = *ours;
    const Bytes hello = encode_hello(first);
    if (auto w = co_await write_all(*s, hello); !w) co_return fail(w.error());
    auto answer = co_await read_record(*s);
    if (!answer) co_return fail(answer.error());
    if (answer->kind == AuthRecordKind::refused)
        co_return fail(Errc::unauthorized,
                       peer + " rejected our proof of the shared key: do both sides use the same TP_RPC_AUTH_KEY?");
    if (answer->kind != AuthRecordKind::proof)
        co_return fail(Errc::protocol_error, peer + " answered our proof with a verdict");
    auto expected = handshake_proof(auth.key, t, ProofBy::client);
    if (!expected) co_return fail(expected.error());
    if (!same_proof(*expected, answer->proof)) {
        const std::string why = "our proof of the shared key is wrong: do both sides use the same TP_RPC_AUTH_KEY?";
        (void)co_await send_record(*s, AuthRecordKind::refused, why);
        co_return fail(Errc::unauthorized,
                       peer + " sent a wrong proof of the shared key: do both sides use the same TP_RPC_AUTH_KEY?");
    }
    if (auth.admit)
        if (auto a = auth.admit(theirs->info); !a) {
            (void)co_await send_record(*s, AuthRecordKind::refused, a.error().message());
            co_return fail(Errc::unauthorized, peer + " is refused: " + a.error().message());
        }
    const std::string none;
    if (auto w = co_await send_record(*s, AuthRecordKind::accepted, none); !w) co_return fail(w.error());

    // Both keys are proven: the client's offers, then ours with the answer, each under a MAC.
    auto offered = co_await read_hello(*s);
    if (!offered) co_return fail(offered.error());
    if (offered->step != HelloStep::offers)
        co_return fail(Errc::protocol_error, peer + " sent no offers after the proofs");
    if (offered->info.name != theirs->info.name || offered->info.rank != theirs->info.rank)
        co_return fail(Errc::protocol_error, peer + " changed its name or rank after the proofs");
    const Transcript their_offers{kProtocolVersion, &offered->info, &first.info, theirs->nonce, first.nonce, nullptr};
    auto expected_mac = handshake_proof(auth.key, their_offers, ProofBy::client_offers);
    if (!expected_mac) co_return fail(expected_mac.error());
    if (!same_proof(*expected_mac, offered->proof))
        co_return fail(Errc::unauthorized, peer + " sent offers under a wrong MAC (changed on the way?)");
    mine.info = channel_offers_for(std::move(mine.info), offered->info, s->socket.native_handle(), s->peer_pid);
    auto chosen = negotiate(mine.info, offered->info, s->transport);
    mine.step = HelloStep::offers;
    if (chosen) mine.answer = *chosen;
    const Transcript our_offers{kProtocolVersion, &offered->info, &mine.info, theirs->nonce, first.nonce,
                                mine.answer ? &*mine.answer : nullptr};
    auto mac = handshake_proof(auth.key, our_offers, ProofBy::server_offers);
    if (!mac) co_return fail(mac.error());
    mine.proof = *mac;
    const Bytes reply = encode_hello(mine);
    if (auto w = co_await write_all(*s, reply); !w) co_return fail(w.error());
    if (!chosen) co_return fail(chosen.error());
    s->negotiated = std::move(*chosen);
    if (channel_verdict_needed(s->negotiated))
        if (auto v = co_await read_verdict(*s, mine.info, offered->info, peer); !v) co_return fail(v.error());
    co_return std::move(offered->info);
}

Task<Result<void>> finish_transport(ConnectionState& s, Duration timeout) {
    if (s.polled) co_return ok();
    TransportStream st{std::move(s.socket), s.transport, s.endpoint, s.tcp, nullptr, s.peer_pid};
    auto finishing = finish_stream(st, timeout, s.wrote_last, s.rend - s.rbeg);
    auto r = co_await std::move(finishing);
    s.socket = std::move(st.socket);  // (closed if a polled stream holds it; its executor stays ours)
    if (!r) co_return fail(s.broken(std::move(r).error().on_worker(s.peer.name)));
    if (st.polled) {
        s.polled = std::move(st.polled);
        s.poll_spin = s.polled->poll_spin();
    }
    co_return ok();
}

}  // namespace tensorplay::detail
