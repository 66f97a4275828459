// resolve_host: name resolution that leaves no thread behind (private).
#pragma once

#include <tensorplay/core/result.hpp>
#include <tensorplay/core/task.hpp>

#include <asio/ip/tcp.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tensorplay::detail {

/// The TCP endpoints of `host:port`. A numeric address is converted in place. A name is resolved by
/// getaddrinfo on a thread of its own, which ends with the lookup; the awaiting coroutine polls for
/// the answer with a timer, so cancelling it (a timeout) abandons the lookup safely. (Asio's
/// asynchronous resolver starts a thread that stays for the event loop's life, and a second thread
/// in the process makes every context switch of the event loop's thread dearer.)
/// Errors: io_error naming the host when it does not resolve.
[[nodiscard]] Task<Result<std::vector<asio::ip::tcp::endpoint>>> resolve_host(std::string host, std::uint16_t port);

}  // namespace tensorplay::detail
