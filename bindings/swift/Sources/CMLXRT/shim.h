/* The generated header, in the repository's include/ (one copy, never stale). */
#include "../../../../include/mlxrt.h"
