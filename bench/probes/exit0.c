/* A program that exits 0 at once, with no C library: built with -nostdlib -static, its start
 * is the kernel's exec and exit alone. bench/process_start.py measures it beside `true`. */
#if defined(__x86_64__)
__asm__(".globl _start\n_start:\n\tmov $60, %eax\n\txor %edi, %edi\n\tsyscall\n");
#elif defined(__aarch64__)
__asm__(".globl _start\n_start:\n\tmov x8, #93\n\tmov x0, #0\n\tsvc #0\n");
#else
#error "exit0.c knows the exit system call of x86_64 and aarch64 only"
#endif
