/* Whether oneDNN has fast bf16 kernels on this CPU: the implementation it
 * picks for a small bf16 matmul (AVX512-BF16 or AMX brgemm, or a reference
 * loop when the CPU, or ONEDNN_MAX_CPU_ISA, allows no bf16 instructions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/dnnl_util.h"

remat_status op_bf16_kernel(dnnl_engine_t engine, char *impl, size_t cap) {
  snprintf(impl, cap, "none");
  const int64_t n = 64;
  dnnl_memory_desc_t a = op_md2_dt(n, n, n, 1, OP_BF16);
  dnnl_memory_desc_t b = op_md2_dt(n, n, n, 1, OP_BF16);
  dnnl_memory_desc_t c = op_md2_dt(n, n, n, 1, OP_F32);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  if (dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) != dnnl_success ||
      dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) !=
          dnnl_success)
    return REMAT_ERR_BACKEND;
  const char *name = NULL;
  dnnl_status_t st =
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
  if (st == dnnl_success && name != NULL)
    snprintf(impl, cap, "%s", name);
  dnnl_primitive_desc_destroy(pd);
  if (st != dnnl_success || name == NULL || strncmp(name, "ref", 3) == 0)
    return REMAT_ERR_BACKEND;
  return REMAT_OK;
}
