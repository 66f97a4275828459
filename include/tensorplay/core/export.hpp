// What the shared library exports. It is built with hidden visibility (-fvisibility=hidden): only
// declarations marked TP_API are part of its ABI; everything else, tensorplay::detail included, stays inside.
#pragma once

/// Marks a class or function of the public API as exported by libtensorplay-rpc (GCC and clang).
#define TP_API __attribute__((visibility("default")))
