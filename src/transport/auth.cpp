// Peer authentication primitives: nonces (RAND_bytes), HMAC-SHA256 (HMAC), constant-time
// comparison (CRYPTO_memcmp). No cryptography of our own: only the transcript's layout.
#include "transport/auth.hpp"

#include <tensorplay/core/log.hpp>
#include <tensorplay/core/wire.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

namespace tensorplay::detail {

namespace {
/// Domain separation: these proofs serve this handshake only.
constexpr std::string_view kTranscriptContext = "tensorplay-rpc handshake proof";

void put_hello(WireWriter& w, const HelloInfo& h) {
    w.str32(h.name).i32(h.rank);
    w.u32(static_cast<std::uint32_t>(h.transports.size()));
    for (const auto& t : h.transports) w.str32(t.name).str32(t.domain).str32(t.address);
    w.u32(static_cast<std::uint32_t>(h.channels.size()));
    for (const auto& c : h.channels) w.str32(c.name).str32(c.device_type).str32(c.domain).str32(c.params);
}
}  // namespace

Result<Nonce> make_nonce() {
    Nonce n;
    if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
        return fail(Errc::io_error, "the system's random generator failed (OpenSSL RAND_bytes): cannot make a handshake nonce");
    return n;
}

Result<Proof> hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
    if (key.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        return fail(Errc::invalid_argument, "the shared key is too long");
    Proof out;
    unsigned int len = 0;
    // (HMAC's one-shot form: in OpenSSL 1.1 and 3 alike, not deprecated; a null key pointer with
    // length 0 is allowed but never happens here.)
    static const std::uint8_t empty = 0;
    if (!HMAC(EVP_sha256(), key.empty() ? &empty : key.data(), static_cast<int>(key.size()), data.data(), data.size(),
              out.data(), &len) ||
        len != out.size())
        return fail(Errc::io_error, "HMAC-SHA256 failed (OpenSSL)");
    return out;
}

bool same_proof(const Proof& a, const Proof& b) noexcept { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Bytes transcript_bytes(const Transcript& t, ProofBy by) {
    WireWriter w;
    w.str32(kTranscriptContext).u8(static_cast<std::uint8_t>(by)).u16(t.version);
    put_hello(w, *t.client);
    put_hello(w, *t.server);
    w.raw(t.client_nonce).raw(t.server_nonce);
    // The server's answer: a proof of the key also proves where the client is sent next.
    if (t.answer) {
        w.u8(1).str32(t.answer->transport).str32(t.answer->address).u32(static_cast<std::uint32_t>(t.answer->channels.size()));
        for (const auto& c : t.answer->channels) w.str32(c.client_device).str32(c.server_device).str32(c.channel);
    } else {
        w.u8(0);
    }
    return std::move(w).take();
}

Result<Proof> handshake_proof(const Secret& key, const Transcript& t, ProofBy by) {
    const Bytes data = transcript_bytes(t, by);
    return hmac_sha256(key.bytes(), data);
}

namespace {
/// A buffer wiped when it goes, whatever path leaves read_auth_key_file.
struct WipedOnExit {
    std::string bytes;
    char chunk[4096];
    // (Room for the largest key and one chunk more, which the read loop never passes: `bytes`
    // never reallocates, so no unwiped copy of it is left behind.)
    WipedOnExit() { bytes.reserve(kMaxAuthKeyBytes + sizeof chunk); }
    ~WipedOnExit() {
        OPENSSL_cleanse(bytes.data(), bytes.capacity());
        OPENSSL_cleanse(chunk, sizeof chunk);
    }
};
}  // namespace

Result<Secret> read_auth_key_file(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f)
        return fail(Errc::invalid_argument, "cannot read the auth key file \"" + path + "\": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fileno(f), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
        log(LogLevel::warn, "transport", "the auth key file \"" + path + "\" can be read by other users (chmod 600 it)");
    // (Unbuffered: stdio's own buffer would hold a copy of the key that nothing wipes.)
    std::setvbuf(f, nullptr, _IONBF, 0);
    WipedOnExit key;
    std::size_t n = 0;
    while ((n = std::fread(key.chunk, 1, sizeof key.chunk, f)) > 0) {
        key.bytes.append(key.chunk, n);
        if (key.bytes.size() > kMaxAuthKeyBytes) break;
    }
    const bool bad = std::ferror(f) != 0;
    std::fclose(f);
    if (bad) return fail(Errc::invalid_argument, "cannot read the auth key file \"" + path + "\"");
    if (key.bytes.size() > kMaxAuthKeyBytes)
        return fail(Errc::invalid_argument, "the auth key file \"" + path + "\" is larger than " +
                                                std::to_string(kMaxAuthKeyBytes) + " bytes: is it the right file?");
    std::string_view bytes = key.bytes;
    while (!bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r')) bytes.remove_suffix(1);
    if (bytes.empty()) return fail(Errc::invalid_argument, "the auth key file \"" + path + "\" is empty");
    return Secret(bytes);
}

}  // namespace tensorplay::detail
