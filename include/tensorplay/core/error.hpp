// Error values shared by every layer: an Errc category, a message for a person, the worker it came from.
#pragma once

#include <tensorplay/core/export.hpp>
#include <iosfwd>
#include <string>
#include <string_view>
#include <system_error>

namespace tensorplay {

/// What went wrong, coarse enough for a caller to decide whether to retry.
enum class Errc {
    invalid_argument,   ///< the caller passed a bad value; do not retry
    type_error,         ///< a value of the wrong type (the seed's TypeError)
    already_registered, ///< a name is taken
    unknown_backend,    ///< no backend registered under that name
    timeout,            ///< a deadline passed; the operation may be retried
    connection_lost,    ///< the peer went away (EOF, reset, broken pipe)
    protocol_error,     ///< the peer sent bytes that break the protocol
    remote_error,       ///< a handler on another worker failed; message says which
    shutdown,           ///< the object was shut down before or during the call
    device_error,       ///< a device is missing, unmapped or failed
    store_error,        ///< the key-value store refused or failed an operation
    unauthorized,       ///< the peer is not allowed to do that
    io_error,           ///< an operating-system error not covered above
    cancelled,          ///< the operation was cancelled by its caller
    not_supported,      ///< a feature that was not built or is not available here
    not_found,          ///< a key, worker or handler does not exist
    internal,           ///< a bug in this library (an exception escaped, an invariant broke)
};

/// Stable snake_case name of a code ("timeout", "remote_error", ...).
[[nodiscard]] TP_API std::string_view to_string(Errc code) noexcept;

/// A copyable error value: code, human-readable message, optional worker name and OS cause.
class TP_API Error {
public:
    Error(Errc code, std::string message, std::string worker = {}, std::error_code cause = {});

    [[nodiscard]] Errc code() const noexcept { return code_; }
    [[nodiscard]] const std::string& message() const noexcept { return message_; }
    /// Name of the worker the error came from; empty when it is local.
    [[nodiscard]] const std::string& worker() const noexcept { return worker_; }
    /// The operating-system or Asio error behind this one, if any.
    [[nodiscard]] std::error_code cause() const noexcept { return cause_; }

    /// Prefixes the message with what the caller was doing: "ctx: message".
    Error& context(std::string_view what) &;
    [[nodiscard]] Error&& context(std::string_view what) &&;
    /// Sets the worker the error came from.
    [[nodiscard]] Error&& on_worker(std::string worker) &&;

    /// "timeout: message", or "remote_error: on worker "w": message".
    [[nodiscard]] std::string to_string() const;

    friend bool operator==(const Error& a, const Error& b) noexcept {
        return a.code_ == b.code_ && a.message_ == b.message_ && a.worker_ == b.worker_;
    }

private:
    Errc code_;
    std::string message_;
    std::string worker_;
    std::error_code cause_;
};

TP_API std::ostream& operator<<(std::ostream& os, const Error& e);
TP_API std::ostream& operator<<(std::ostream& os, Errc code);

/// Converts an OS/Asio error code: operation_aborted is cancelled; eof, reset and broken pipe are
/// connection_lost; timed_out is timeout; the rest io_error. `what` names the operation.
[[nodiscard]] TP_API Error from_error_code(std::error_code ec, std::string_view what);

}  // namespace tensorplay
