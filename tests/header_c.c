/* Header hygiene: mla.h compiles on its own as strict C11 with
 * -Wall -Wextra -Werror -pedantic (see meson.build), twice over (include
 * guard), and declares what it documents. */
#include <mla.h>
#include <mla.h>

int main(void) {
    mla_plan_desc desc;
    mla_batch batch;
    mla_tensors tensors;
    mla_schedule_info info;
    mla_status st = mla_plan_desc_init(&desc);
    st |= mla_batch_init(&batch);
    st |= mla_tensors_init(&tensors);
    st |= mla_schedule_info_init(&info);
    mla_plan_destroy((mla_plan *)0);
    return st == MLA_SUCCESS && mla_version() == MLA_VERSION && desc.struct_size == sizeof desc &&
                   mla_status_string(MLA_SUCCESS) != (const char *)0
               ? 0
               : 1;
}
