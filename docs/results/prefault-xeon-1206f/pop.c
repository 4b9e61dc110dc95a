#include <sys/mman.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ size_t n=(size_t)atol(argv[1])<<20; int huge=atoi(argv[2]);
 char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 if(huge) madvise(p,n,MADV_HUGEPAGE); else madvise(p,n,MADV_NOHUGEPAGE);
 double t=now(); int r=madvise(p,n,23); double t1=now();
 printf("populate %zu MiB huge=%d: rc=%d %.3f s (%.2f GB/s)\n", n>>20, huge, r, t1-t, n/(t1-t)/1e9);
 t=now(); for(size_t i=0;i<n;i+=4096) p[i]=1; t1=now(); printf("touch after: %.3f s\n", t1-t);
 return 0;}
