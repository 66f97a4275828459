// The one translation unit that compiles Asio (ASIO_SEPARATE_COMPILATION); the library exports it.
#include <asio/impl/src.hpp>
