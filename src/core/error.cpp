// Error: names, printing and the one conversion from std::error_code.
#include <tensorplay/core/error.hpp>

#include <asio/error.hpp>

#include <ostream>

namespace tensorplay {

std::string_view to_string(Errc code) noexcept {
    switch (code) {
        case Errc::invalid_argument: return "invalid_argument";
        case Errc::type_error: return "type_error";
        case Errc::already_registered: return "already_registered";
        case Errc::unknown_backend: return "unknown_backend";
        case Errc::timeout: return "timeout";
        case Errc::connection_lost: return "connection_lost";
        case Errc::protocol_error: return "protocol_error";
        case Errc::remote_error: return "remote_error";
        case Errc::shutdown: return "shutdown";
        case Errc::device_error: return "device_error";
        case Errc::store_error: return "store_error";
        case Errc::unauthorized: return "unauthorized";
        case Errc::io_error: return "io_error";
        case Errc::cancelled: return "cancelled";
        case Errc::not_supported: return "not_supported";
        case Errc::not_found: return "not_found";
        case Errc::internal: return "internal";
    }
    return "unknown";
}

Error::Error(Errc code, std::string message, std::string worker, std::error_code cause)
    : code_(code), message_(std::move(message)), worker_(std::move(worker)), cause_(cause) {}

Error& Error::context(std::string_view what) & {
    if (!what.empty()) message_ = std::string(what) + ": " + message_;
    return *this;
}

Error&& Error::context(std::string_view what) && { return std::move(context(what)); }

Error&& Error::on_worker(std::string worker) && {
    worker_ = std::move(worker);
    return std::move(*this);
}

std::string Error::to_string() const {
    std::string out(tensorplay::to_string(code_));
    out += ": ";
    if (!worker_.empty()) out += "on worker \"" + worker_ + "\": ";
    out += message_;
    return out;
}

std::ostream& operator<<(std::ostream& os, const Error& e) { return os << e.to_string(); }
std::ostream& operator<<(std::ostream& os, Errc code) { return os << to_string(code); }

Error from_error_code(std::error_code ec, std::string_view what) {
    Errc code = Errc::io_error;
    if (ec == asio::error::operation_aborted || ec == std::errc::operation_canceled) {
        code = Errc::cancelled;
    } else if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
               ec == asio::error::connection_aborted || ec == asio::error::not_connected ||
               ec == asio::error::shut_down) {
        code = Errc::connection_lost;
    } else if (ec == asio::error::timed_out || ec == std::errc::timed_out) {
        code = Errc::timeout;
    } else if (ec == std::errc::invalid_argument) {
        code = Errc::invalid_argument;
    }
    std::string msg(what);
    if (!msg.empty()) msg += ": ";
    msg += ec.message();
    return Error(code, std::move(msg), {}, ec);
}

}  // namespace tensorplay
