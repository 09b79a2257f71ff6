/* GNUstep headers include <objc/blocks_runtime.h> (libobjc2's) when the
 * compiler has blocks; with GCC's libobjc, libBlocksRuntime's Block.h is it. */
#include <Block.h>
