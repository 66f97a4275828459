// Result<T>: the one seam where the expected type is chosen (tl::expected today, std::expected later).
#pragma once

#include <tensorplay/core/error.hpp>

#include <tl/expected.hpp>

#include <string>
#include <utility>

namespace tensorplay {

/// A value or an Error. No exception crosses the public API; errors travel in this type.
template <class T>
using Result = tl::expected<T, Error>;

/// The error half of a Result, as returned by fail().
using Failure = tl::unexpected<Error>;

/// Builds a failed Result: `return fail(Errc::invalid_argument, "...");`.
[[nodiscard]] inline Failure fail(Errc code, std::string message, std::string worker = {}) {
    return Failure(Error(code, std::move(message), std::move(worker)));
}

/// Wraps an existing Error as a failed Result.
[[nodiscard]] inline Failure fail(Error error) { return Failure(std::move(error)); }

/// A successful Result<void>.
[[nodiscard]] inline Result<void> ok() { return {}; }

}  // namespace tensorplay
