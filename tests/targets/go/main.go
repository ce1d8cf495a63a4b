// A Go target for mt-agent's tests. Go passes arguments in registers (RAX,
// RBX, RCX, ...) and moves goroutine stacks, which is why mt-agent times
// Go calls with probes on `ret` instructions and not with uretprobes.
//
//	gotarget calls N GAP_MS   trigger(i) for i in 0..N, GAP_MS apart
//	gotarget slow N           slow(i) for i in 0..N; i in {10,20,30} sleep 50 ms
//	gotarget long N MS        long(i) for i in 0..N back to back: even i burn MS ms of
//	                          CPU, odd i sleep MS ms (a handler that is slow either way)
//	gotarget handler N MS     in a goroutine, N times: handler(i), which
//	                          burns MS ms in burnCPU, then trigger(i)
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"time"
)

var sink int

//go:noinline
func trigger(i int) int {
	sink += i
	return i * 2
}

// grow uses enough stack to make the runtime move the goroutine's stack.
//
//go:noinline
func grow(n int) int {
	var buf [256]byte
	buf[n%256] = byte(n)
	if n == 0 {
		return int(buf[0])
	}
	return grow(n-1) + int(buf[n%256])
}

//go:noinline
func slow(i int) int {
	if i == 10 || i == 20 || i == 30 {
		time.Sleep(50 * time.Millisecond)
		grow(200)
	}
	sink += i
	return i + 1
}

//go:noinline
func long(i int, d time.Duration) int {
	if i%2 == 0 {
		burn(d)
	} else {
		time.Sleep(d)
	}
	sink += i
	return i + 1
}

func burn(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		sink++
	}
}

// handler and burnCPU: a request's work two calls below the goroutine's
// start, for the frame-pointer stacks (tests/tests/unwind.rs).
//
//go:noinline
func handler(i int, ms int) int {
	burnCPU(time.Duration(ms) * time.Millisecond)
	return trigger(i)
}

//go:noinline
func burnCPU(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		sink++
	}
}

func main() {
	mode := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	gap := 0
	if len(os.Args) > 3 {
		gap, _ = strconv.Atoi(os.Args[3])
	}
	fmt.Printf("ready %d\n", os.Getpid())
	bufio.NewReader(os.Stdin).ReadString('\n')
	burn(200 * time.Millisecond)
	switch mode {
	case "calls":
		for i := 0; i < n; i++ {
			trigger(i)
			burn(time.Duration(gap) * time.Millisecond)
		}
	case "slow":
		for i := 0; i < n; i++ {
			slow(i)
		}
	case "long":
		for i := 0; i < n; i++ {
			long(i, time.Duration(gap)*time.Millisecond)
		}
	case "handler":
		done := make(chan bool)
		go func() {
			for i := 0; i < n; i++ {
				handler(i, gap)
			}
			done <- true
		}()
		<-done
	}
	burn(200 * time.Millisecond)
	fmt.Println("done")
}
