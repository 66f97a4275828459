// The one translation unit that compiles Asio (ASIO_SEPARATE_COMPILATION); the library exports it
// (default visibility, as core/asio_visibility.hpp explains).
#pragma GCC visibility push(default)
#include <asio/impl/src.hpp>
#pragma GCC visibility pop
