// Private: what env:// reads from the launcher's environment. torch's variables (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE: torchrun, Kubeflow's PyTorchJob, a shell) come first; where one is
// unset, Slurm's stand in for it (srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST and
// SLURM_JOB_ID, not torch's): no wrapper script is needed under srun.
#pragma once

#include <tensorplay/core/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tensorplay::detail {

/// At most this many hosts, and bytes of their names, in an expanded Slurm host list (a larger
/// one is refused, not expanded).
inline constexpr std::size_t kMaxHostlist = 65536;
inline constexpr std::size_t kMaxHostlistBytes = std::size_t{1} << 20;

/// Expands a Slurm host list ("node[01-03,07],login1", "rack[1-2]-gpu[0-1]") into host names in
/// order, each bracket group's ranges keeping the zero padding of their lower bound, several groups
/// in one name giving every combination. Errc::invalid_argument saying what is wrong (an unclosed
/// or empty bracket, a range that runs backwards or is not numeric, more than kMaxHostlist hosts or
/// kMaxHostlistBytes of names).
[[nodiscard]] Result<std::vector<std::string>> expand_hostlist(std::string_view list);

/// The port every task of Slurm job `job_id` derives when MASTER_PORT is unset: 15000 plus the
/// job id's last four decimal digits (15000..24999), as PyTorch Lightning does.
[[nodiscard]] std::uint16_t slurm_port(std::uint64_t job_id) noexcept;

/// One variable of the launcher's environment, as env:// reads it.
struct LauncherValue {
    std::string value;
    std::string source;  ///< the variable it came from ("RANK", "SLURM_PROCID", ...): for messages
};

/// torch's `name` (MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE) from the environment, else what
/// Slurm's variables give for it (SLURM_PROCID, SLURM_NTASKS, the first host of SLURM_JOB_NODELIST
/// or SLURM_NODELIST, slurm_port(SLURM_JOB_ID)); nothing when neither is set. An error when the
/// Slurm variable it would come from is malformed, naming it.
[[nodiscard]] Result<std::optional<LauncherValue>> launcher_env(std::string_view name);

}  // namespace tensorplay::detail
