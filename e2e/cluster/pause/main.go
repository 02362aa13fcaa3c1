// Command pause is the first process of every pod sandbox on the test nodes, like Kubernetes'
// build/pause/linux/pause.c: it holds the pod's namespaces open, never exits on its own (a new
// sandbox would mean a CNI DEL and ADD), reaps the children re-parented to it, and exits 0 on
// SIGTERM or SIGINT. Static (CGO_ENABLED=0), so it runs from an image that holds nothing else.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down on %v\n", sig)
		os.Exit(0)
	}
}

// reap collects every exited child without blocking: one SIGCHLD may stand for several.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
