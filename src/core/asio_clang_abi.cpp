// The six any_io_executor require/prefer specializations that the library compiles (Asio's separate
// compilation), exported once more under the names clang 14 gives them, so that clang users link.
//
// any_io_executor.hpp declares them as explicit specializations, whose signatures hold the dependent
// expression constraint<traits::prefer_member<...>::is_valid>. GCC mangles that expression with the
// traits namespace spelled out and prefer_member's defaulted third argument (void) appended
// ("srNS_6traits13prefer_memberI...vEE"); clang mangles it as written ("sr6traits13prefer_memberI...EE").
// Every other symbol a user's translation unit takes from the library mangles alike (checked with nm
// on the undefined symbols of a clang-built consumer), so these six are the whole difference.
//
// Each function below has the ABI of the member it stands for (hidden result pointer, this, property,
// int) and calls that member, which the GCC-built library defines under GCC's name. The names are
// those of Asio 1.22; tests/install checks a clang consumer links and runs, so a change shows there.
#include <tensorplay/core/export.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/execution.hpp>

#if !defined(__clang__) && !defined(ASIO_USE_TS_EXECUTOR_AS_DEFAULT)

namespace tensorplay::detail {

namespace ex = asio::execution;
using Executor = asio::any_io_executor;

#define TP_CLANG_NAME(fn, member, Property, clang_name)                                    \
    TP_API Executor fn(const Executor* self, const Property& p, int) __asm__(clang_name);  \
    Executor fn(const Executor* self, const Property& p, int) { return self->member(p); }

TP_CLANG_NAME(clang_require_never, require, ex::blocking_t::never_t,
              "_ZNK4asio15any_io_executor7requireINS_9execution6detail8blocking7never_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits14require_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEES6_NS2_11prefer_onlyINS4_10possibly_tILi0EEEEENSG_INS3_16outstanding_work9tracked_tILi0EEEEENSG_INSK_11untracked_tILi0EEEEENSG_INS3_12relationship6fork_tILi0EEEEENSG_INSR_14continuation_tILi0EEEEEEEES9_EE8is_validEiE4typeE")
TP_CLANG_NAME(clang_prefer_possibly, prefer, ex::blocking_t::possibly_t,
              "_ZNK4asio15any_io_executor6preferINS_9execution6detail8blocking10possibly_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits13prefer_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEENS4_7never_tILi0EEENS2_11prefer_onlyIS6_EENSI_INS3_16outstanding_work9tracked_tILi0EEEEENSI_INSK_11untracked_tILi0EEEEENSI_INS3_12relationship6fork_tILi0EEEEENSI_INSR_14continuation_tILi0EEEEEEEES9_EE8is_validEiE4typeE")
TP_CLANG_NAME(clang_prefer_tracked, prefer, ex::outstanding_work_t::tracked_t,
              "_ZNK4asio15any_io_executor6preferINS_9execution6detail16outstanding_work9tracked_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits13prefer_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEENS3_8blocking7never_tILi0EEENS2_11prefer_onlyINSG_10possibly_tILi0EEEEENSJ_IS6_EENSJ_INS4_11untracked_tILi0EEEEENSJ_INS3_12relationship6fork_tILi0EEEEENSJ_INSR_14continuation_tILi0EEEEEEEES9_EE8is_validEiE4typeE")
TP_CLANG_NAME(clang_prefer_untracked, prefer, ex::outstanding_work_t::untracked_t,
              "_ZNK4asio15any_io_executor6preferINS_9execution6detail16outstanding_work11untracked_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits13prefer_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEENS3_8blocking7never_tILi0EEENS2_11prefer_onlyINSG_10possibly_tILi0EEEEENSJ_INS4_9tracked_tILi0EEEEENSJ_IS6_EENSJ_INS3_12relationship6fork_tILi0EEEEENSJ_INSR_14continuation_tILi0EEEEEEEES9_EE8is_validEiE4typeE")
TP_CLANG_NAME(clang_prefer_fork, prefer, ex::relationship_t::fork_t,
              "_ZNK4asio15any_io_executor6preferINS_9execution6detail12relationship6fork_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits13prefer_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEENS3_8blocking7never_tILi0EEENS2_11prefer_onlyINSG_10possibly_tILi0EEEEENSJ_INS3_16outstanding_work9tracked_tILi0EEEEENSJ_INSN_11untracked_tILi0EEEEENSJ_IS6_EENSJ_INS4_14continuation_tILi0EEEEEEEES9_EE8is_validEiE4typeE")
TP_CLANG_NAME(clang_prefer_continuation, prefer, ex::relationship_t::continuation_t,
              "_ZNK4asio15any_io_executor6preferINS_9execution6detail12relationship14continuation_tILi0EEEEES0_RKT_NS_10constraintIXsr6traits13prefer_memberIRKNS2_12any_executorIJNS2_12context_as_tIRNS_17execution_contextEEENS3_8blocking7never_tILi0EEENS2_11prefer_onlyINSG_10possibly_tILi0EEEEENSJ_INS3_16outstanding_work9tracked_tILi0EEEEENSJ_INSN_11untracked_tILi0EEEEENSJ_INS4_6fork_tILi0EEEEENSJ_IS6_EEEEES9_EE8is_validEiE4typeE")

#undef TP_CLANG_NAME

}  // namespace tensorplay::detail

#endif
