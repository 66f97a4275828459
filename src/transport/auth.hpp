// Peer authentication for the handshake (private): nonces, HMAC-SHA256 proofs over the handshake's
// transcript, constant-time comparison, all from OpenSSL's libcrypto; and reading a key file.
#pragma once

#include <tensorplay/core/bytes.hpp>
#include <tensorplay/core/result.hpp>
#include <tensorplay/transport/connection.hpp>

#include "transport/transport.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tensorplay::detail {

inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kProofSize = 32;  ///< an HMAC-SHA256

using Nonce = std::array<std::uint8_t, kNonceSize>;
using Proof = std::array<std::uint8_t, kProofSize>;

/// A fresh nonce from the operating system's generator (RAND_bytes). Errc::io_error when it fails.
[[nodiscard]] Result<Nonce> make_nonce();

/// HMAC-SHA256 of `data` under `key`. Errc::io_error when libcrypto fails.
[[nodiscard]] Result<Proof> hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);

/// Whether two proofs are equal, in time independent of where they differ (CRYPTO_memcmp).
[[nodiscard]] bool same_proof(const Proof& a, const Proof& b) noexcept;

/// Whose proof a transcript is for: the label keeps one side's proof from serving as the other's,
/// and a proof of the key from serving as the MAC of a side's offers (version 7).
enum class ProofBy : std::uint8_t { client = 1, server = 2, client_offers = 3, server_offers = 4 };

/// What both sides said in the handshake, as each proof covers it (docs/protocol.md, "Handshake").
struct Transcript {
    std::uint16_t version = kProtocolVersion;
    const HelloInfo* client = nullptr;
    const HelloInfo* server = nullptr;
    Nonce client_nonce{};
    Nonce server_nonce{};
    const Negotiated* answer = nullptr;  ///< the server's answer (null: none)
};

/// The bytes a proof is computed over: a fixed context, the direction label, the version, each
/// side's name, rank, transport and channel offers (the negotiation's inputs), both nonces and the
/// server's answer.
[[nodiscard]] Bytes transcript_bytes(const Transcript& t, ProofBy by);

/// HMAC-SHA256 under `key` of the transcript for `by`'s proof.
[[nodiscard]] Result<Proof> handshake_proof(const Secret& key, const Transcript& t, ProofBy by);


}  // namespace tensorplay::detail
