// Address: listening URLs of the transports, parsed and printed (address.hpp).
#include <tensorplay/transport/address.hpp>

#include "transport/schemes.hpp"

#include <charconv>
#include <string>

namespace tensorplay {

namespace {
constexpr std::size_t kMaxAbstractName = 106;  // sun_path (108) less the leading NUL, less one spare
}  // namespace

Result<Address> Address::parse(std::string_view url) {
    auto scheme_end = url.find("://");
    if (scheme_end == std::string_view::npos)
        return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\" has no scheme (" + detail::known_schemes() + ")");
    const std::string_view scheme = url.substr(0, scheme_end), rest = url.substr(scheme_end + 3);
    const detail::SchemeInfo* info = detail::scheme_info(scheme);
    if (!info)
        return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\": unknown scheme \"" + std::string(scheme) +
                                                "\" (known: " + detail::known_schemes() + ")");
    Address a;
    a.scheme = std::string(scheme);
    if (info->form == detail::AddressForm::name) {
        if (rest.empty() || rest.size() > kMaxAbstractName || rest.find('\0') != std::string_view::npos)
            return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\": the socket name must have 1 to " +
                                                    std::to_string(kMaxAbstractName) + " bytes and no NUL");
        a.name = std::string(rest);
        return a;
    }
    std::string_view host, port;
    if (!rest.empty() && rest.front() == '[') {
        auto close = rest.find(']');
        if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
            return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\": expected " + a.scheme + "://[v6 address]:port");
        host = rest.substr(1, close - 1);
        port = rest.substr(close + 2);
    } else {
        auto colon = rest.rfind(':');
        if (colon == std::string_view::npos)
            return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\" has no port");
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
    }
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
        return fail(Errc::invalid_argument, "address \"" + std::string(url) + "\": bad host or port");
    a.host = std::string(host);
    a.port = static_cast<std::uint16_t>(value);
    return a;
}

Address Address::tcp(std::string host, std::uint16_t port) {
    Address a;
    a.scheme = "tcp";
    a.host = std::move(host);
    a.port = port;
    return a;
}

Address Address::uds(std::string name) {
    Address a;
    a.scheme = "uds";
    a.name = std::move(name);
    return a;
}

namespace {
bool named_form(const std::string& scheme) {
    const detail::SchemeInfo* info = detail::scheme_info(scheme);
    return info && info->form == detail::AddressForm::name;
}
}  // namespace

std::string Address::str() const {
    if (named_form(scheme)) return scheme + "://" + name;
    return scheme + "://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string Address::where() const { return named_form(scheme) ? str() : host + ":" + std::to_string(port); }

std::string_view Address::transport() const noexcept {
    const detail::SchemeInfo* info = detail::scheme_info(scheme);
    return info ? info->transport : std::string_view();
}

}  // namespace tensorplay
