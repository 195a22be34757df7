// Command pause is the node test's sandbox image (containerd's CRI needs
// one; registry.k8s.io is out of reach): it sleeps until SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
