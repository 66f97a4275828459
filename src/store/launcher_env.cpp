// The launcher's environment as env:// reads it (launcher_env.hpp): torch's variables, else Slurm's.
#include "store/launcher_env.hpp"

#include <cstdlib>
#include <string>

namespace tensorplay::detail {

namespace {

Failure bad_hostlist(std::string_view list, const std::string& why) {
    return fail(Errc::invalid_argument, "the Slurm host list \"" + std::string(list.substr(0, 200)) + "\" " + why);
}

/// "07" -> 7 (digits only, at most 9 of them); nothing otherwise.
std::optional<std::uint32_t> number(std::string_view s) {
    if (s.empty() || s.size() > 9) return std::nullopt;
    std::uint32_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + static_cast<std::uint32_t>(c - '0');
    }
    return v;
}

/// The names of one bracket group's body ("01-03,7"), padded as their range's lower bound is.
Result<std::vector<std::string>> expand_ranges(std::string_view list, std::string_view body) {
    std::vector<std::string> out;
    if (body.empty()) return bad_hostlist(list, "has an empty [] group");
    while (!body.empty()) {
        const auto comma = body.find(',');
        const std::string_view range = body.substr(0, comma);
        body = comma == std::string_view::npos ? std::string_view{} : body.substr(comma + 1);
        const auto dash = range.find('-');
        const std::string_view lo_text = range.substr(0, dash);
        const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
        const auto lo = number(lo_text), hi = number(hi_text);
        if (!lo || !hi) return bad_hostlist(list, "has \"" + std::string(range) + "\" in brackets: not a number or a range of numbers");
        if (*hi < *lo) return bad_hostlist(list, "has the range \"" + std::string(range) + "\", which runs backwards");
        if (out.size() + (*hi - *lo) >= kMaxHostlist) return bad_hostlist(list, "names more than " + std::to_string(kMaxHostlist) + " hosts");
        for (std::uint32_t v = *lo;; ++v) {
            std::string s = std::to_string(v);
            if (s.size() < lo_text.size()) s.insert(0, lo_text.size() - s.size(), '0');
            out.push_back(std::move(s));
            if (v == *hi) break;
        }
    }
    return out;
}

/// The hosts of one entry ("rack[1-2]-gpu[0-1]"): every combination of its groups, in order;
/// `bytes` counts the characters of `out`.
Result<void> expand_entry(std::string_view list, std::string_view entry, std::vector<std::string>& out, std::size_t& bytes) {
    std::vector<std::string> names{std::string()};
    while (!entry.empty()) {
        const auto open = entry.find('[');
        const std::string_view text = entry.substr(0, open);
        if (text.find(']') != std::string_view::npos) return bad_hostlist(list, "has a ] without its [");
        for (auto& n : names) n += text;
        if (open == std::string_view::npos) break;
        const auto close = entry.find(']', open);
        if (close == std::string_view::npos) return bad_hostlist(list, "has a [ without its ]");
        auto parts = expand_ranges(list, entry.substr(open + 1, close - open - 1));
        if (!parts) return fail(parts.error());
        if (names.size() * parts->size() + out.size() > kMaxHostlist)
            return bad_hostlist(list, "names more than " + std::to_string(kMaxHostlist) + " hosts");
        std::size_t names_bytes = 0, parts_bytes = 0;
        for (const auto& n : names) names_bytes += n.size();
        for (const auto& q : *parts) parts_bytes += q.size();
        if (bytes + names_bytes * parts->size() + names.size() * parts_bytes > kMaxHostlistBytes)
            return bad_hostlist(list, "expands to more than " + std::to_string(kMaxHostlistBytes) + " bytes of host names");
        std::vector<std::string> next;
        next.reserve(names.size() * parts->size());
        for (const auto& n : names)
            for (const auto& p : *parts) next.push_back(n + p);
        names = std::move(next);
        entry = entry.substr(close + 1);
    }
    for (auto& n : names) {
        if (n.empty()) return bad_hostlist(list, "has an empty host name");
        bytes += n.size();
        out.push_back(std::move(n));
    }
    if (bytes > kMaxHostlistBytes)
        return bad_hostlist(list, "expands to more than " + std::to_string(kMaxHostlistBytes) + " bytes of host names");
    return ok();
}

std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list) {
    std::vector<std::string> out;
    std::size_t bytes = 0;
    // Entries are split at commas outside brackets.
    std::size_t start = 0;
    int depth = 0;
    for (std::size_t i = 0; i <= list.size(); ++i) {
        if (i < list.size() && list[i] == '[') ++depth;
        if (i < list.size() && list[i] == ']') --depth;
        if (depth < 0) return bad_hostlist(list, "has a ] without its [");
        if (depth > 1) return bad_hostlist(list, "has brackets inside brackets");
        if (i < list.size() && (list[i] != ',' || depth != 0)) continue;
        if (i == start) return bad_hostlist(list, "has an empty entry");
        if (auto e = expand_entry(list, list.substr(start, i - start), out, bytes); !e) return fail(e.error());
        start = i + 1;
    }
    return out;
}

std::uint16_t slurm_port(std::uint64_t job_id) noexcept { return static_cast<std::uint16_t>(15000 + job_id % 10000); }

Result<std::optional<LauncherValue>> launcher_env(std::string_view name) {
    const std::string torch(name);
    if (auto v = env(torch.c_str())) return std::optional<LauncherValue>(LauncherValue{*v, torch});
    auto from = [](const char* var) -> std::optional<LauncherValue> {
        if (auto v = env(var)) return LauncherValue{*v, var};
        return std::nullopt;
    };
    if (name == "RANK") return from("SLURM_PROCID");
    if (name == "WORLD_SIZE") return from("SLURM_NTASKS");
    if (name == "MASTER_ADDR") {
        auto list = from("SLURM_JOB_NODELIST");
        if (!list) list = from("SLURM_NODELIST");
        if (!list) return std::optional<LauncherValue>{};
        auto hosts = expand_hostlist(list->value);
        if (!hosts) return fail(std::move(hosts).error().context("reading " + list->source + " for MASTER_ADDR"));
        if (hosts->empty()) return fail(Errc::invalid_argument, list->source + " is empty: no host for MASTER_ADDR");
        return std::optional<LauncherValue>(LauncherValue{hosts->front(), "the first host of " + list->source});
    }
    if (name == "MASTER_PORT") {
        auto id = from("SLURM_JOB_ID");
        if (!id) return std::optional<LauncherValue>{};
        const auto n = id->value.size() <= 19 ? number(id->value.size() > 9 ? id->value.substr(id->value.size() - 9) : id->value)
                                               : std::nullopt;
        if (!n || id->value.find_first_not_of("0123456789") != std::string::npos)
            return fail(Errc::invalid_argument, "SLURM_JOB_ID \"" + id->value + "\" is not a job number (for MASTER_PORT)");
        return std::optional<LauncherValue>(LauncherValue{std::to_string(slurm_port(*n)), "a port derived from SLURM_JOB_ID"});
    }
    return std::optional<LauncherValue>{};
}

}  // namespace tensorplay::detail
