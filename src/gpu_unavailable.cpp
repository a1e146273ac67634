// Linked when the library is built without a GPU backend.
#include "errors.h"
#include "plan.h"

namespace mla {

std::unique_ptr<Backend> make_gpu_backend(const PlanConfig &, mla_status *status) {
    *status = fail(MLA_ERROR_BACKEND_UNAVAILABLE, "MLA_BACKEND_GPU requested, but this libmla was built without a GPU backend");
    return nullptr;
}

int gpu_device_count() { return 0; }

}  // namespace mla
