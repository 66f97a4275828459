// The URL schemes of the transports' addresses (schemes.hpp): one line per transport that has
// addresses (ibv, named but not built, has none). Its own file, so that Address links without the
// transports (the fuzz harnesses).
#include "transport/schemes.hpp"

#include <array>

namespace tensorplay::detail {

namespace {
constexpr std::array<SchemeInfo, 3> kSchemes{SchemeInfo{"tcp", "uv", AddressForm::host_port},
                                             SchemeInfo{"uds", "uds", AddressForm::name},
                                             SchemeInfo{"shm", "shm", AddressForm::name}};
}  // namespace

const SchemeInfo* scheme_info(std::string_view scheme) noexcept {
    for (const auto& s : kSchemes)
        if (s.scheme == scheme) return &s;
    return nullptr;
}

std::string known_schemes() {
    std::string s;
    for (const auto& k : kSchemes) s += (s.empty() ? "" : ", ") + std::string(k.scheme) + "://";
    return s;
}

}  // namespace tensorplay::detail
