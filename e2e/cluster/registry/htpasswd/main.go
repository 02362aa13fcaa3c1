// Command registry-htpasswd prints one line of an htpasswd file, "USER:<bcrypt hash>", for the
// password it reads on stdin (one line): the login of the harness's registry, whose htpasswd
// authentication accepts bcrypt hashes only. The password never appears on a command line.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "" || strings.ContainsAny(os.Args[1], ":\n") {
		fmt.Fprintln(os.Stderr, "usage: registry-htpasswd USER <PASSWORD (USER without ':')")
		os.Exit(2)
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintf(os.Stderr, "registry-htpasswd: failed to read the password on stdin: %v\n", err)
		os.Exit(1)
	}
	password := strings.TrimSuffix(line, "\n")
	if password == "" {
		fmt.Fprintln(os.Stderr, "registry-htpasswd: the password on stdin is empty")
		os.Exit(1)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		fmt.Fprintf(os.Stderr, "registry-htpasswd: failed to hash the password: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s\n", os.Args[1], hash)
}
