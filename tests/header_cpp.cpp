// Header hygiene: mla.h compiles on its own as strict C++17 with
// -Wall -Wextra -Werror -pedantic (see meson.build), links through its
// extern "C" block, and its enums and macros are usable from C++.
#include <mla.h>
#include <mla.h>

static_assert(MLA_VERSION == MLA_VERSION_MAJOR * 10000 + MLA_VERSION_MINOR * 100 + MLA_VERSION_PATCH,
              "MLA_VERSION encoding");
static_assert(MLA_HEAD_DIM_QK == 576 && MLA_HEAD_DIM_V == 512, "MLA head dims");

int main() {
    mla_plan_desc desc;
    if (mla_plan_desc_init(&desc) != MLA_SUCCESS || desc.struct_size != sizeof desc) return 1;
    desc.num_heads = 16;
    desc.kv_dtype = MLA_DTYPE_FP8_E4M3;
    desc.backend = MLA_BACKEND_CPU;
    desc.flags = MLA_FLAG_DETERMINISTIC | MLA_FLAG_CALLER_WORKSPACE;
    mla_plan *plan = nullptr;
    if (mla_plan_create(&desc, &plan) != MLA_SUCCESS) return 1;
    mla_plan_destroy(plan);
    return mla_version() == MLA_VERSION ? 0 : 1;
}
