// A Go program built with cgo (dynamically linked, so the preload library reaches it; Go's
// runtime maps its heap through libc's mmap then, `_cgo_mmap`): ARGV[1] MiB of live 4 KiB
// objects, each stamped, hashed twice. Prints "checksum <hex>", the same with or without farmem.
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
)

func main() {
	mib, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: fill MIB")
		os.Exit(2)
	}
	C.free(C.malloc(16)) // cgo in use: the binary links libc
	bufs := make([][]byte, mib*256)
	for i := range bufs {
		b := make([]byte, 4096)
		for j := 0; j < 4096; j += 512 {
			b[j] = byte(i + j/512)
		}
		bufs[i] = b
	}
	h := sha256.New()
	for pass := 0; pass < 2; pass++ {
		for _, b := range bufs {
			h.Write(b)
		}
	}
	fmt.Printf("checksum %x\n", h.Sum(nil)[:8])
}
