// Fuzzes what env:// reads from a launcher's environment: a Slurm host list
// (SLURM_JOB_NODELIST, expanded for MASTER_ADDR) and the port derived from a Slurm job id. Not
// network input, but a malformed or hostile value must be refused with a clear error, and a valid
// one expand within its bounds. (A harness of its own: a list may expand to 65,536 names, which
// would slow the network decoders' harness down to a crawl.)
#include "fuzz_util.hpp"

#include "store/launcher_env.hpp"

#include <cstring>
#include <string>
#include <string_view>

using namespace tensorplay;
using namespace tensorplay::detail;

namespace {

std::string_view text(std::span<const std::uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

// (From the launcher's environment, not the network: bounded by kMaxHostlist and
// kMaxHostlistBytes rather than by the input's size.)
void hostlist(std::span<const std::uint8_t> in) {
    auto hosts = expand_hostlist(text(in));
    if (!hosts) {
        TP_FUZZ_CHECK(hosts.error().code() == Errc::invalid_argument && !hosts.error().message().empty());
        return;
    }
    TP_FUZZ_CHECK(!hosts->empty() && hosts->size() <= kMaxHostlist);
    std::size_t bytes = 0;
    for (const auto& h : *hosts) {
        TP_FUZZ_CHECK(!h.empty() && h.find_first_of("[],") == std::string::npos);
        bytes += h.size();
    }
    TP_FUZZ_CHECK(bytes <= kMaxHostlistBytes);
    // A list without brackets is its entries.
    if (text(in).find('[') == std::string_view::npos) {
        std::string joined;
        for (const auto& h : *hosts) joined += (joined.empty() ? "" : ",") + h;
        TP_FUZZ_CHECK(joined == text(in));
    }
}

void port(std::span<const std::uint8_t> in) {
    std::uint64_t job = 0;
    std::memcpy(&job, in.data(), std::min(in.size(), sizeof job));
    const auto p = slurm_port(job);
    TP_FUZZ_CHECK(p >= 15000 && p <= 24999 && p == 15000 + job % 10000);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Input input(data, size);
    const std::uint8_t which = input.byte();
    const auto in = input.rest();
    if (which % 2 == 0) hostlist(in);
    else port(in);
    return 0;
}
