// Helpers behind with_timeout and block_on: exceptions and deadlines turned into Errors.
#include <tensorplay/core/timeout.hpp>
#include <tensorplay/core/runtime.hpp>

#include <system_error>

namespace tensorplay::detail {

Error error_from_exception_ptr(std::exception_ptr e, std::string_view where) {
    try {
        std::rethrow_exception(e);
    } catch (const std::system_error& se) {
        return from_error_code(se.code(), where);
    } catch (const std::exception& ex) {
        return Error(Errc::internal, std::string(where) + " threw: " + ex.what());
    } catch (...) {
        return Error(Errc::internal, std::string(where) + " threw a non-standard exception");
    }
}

Error error_from_current_exception(std::string_view where) {
    return error_from_exception_ptr(std::current_exception(), where);
}

Error timeout_error(Duration d) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    return Error(Errc::timeout, "timed out after " + std::to_string(ms) + " ms");
}

}  // namespace tensorplay::detail
