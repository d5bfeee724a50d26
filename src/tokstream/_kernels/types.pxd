# The C types every kernel shares: one definition, cimported by each .pyx.
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

# The token dtypes a kernel reads in place (tokstream._validate.KERNEL_DTYPES).
ctypedef fused token_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t

# The dtypes a kernel writes a batch's tokens and position ids in (StreamOptions.out_dtype).
ctypedef fused out_t:
    int32_t
    int64_t
