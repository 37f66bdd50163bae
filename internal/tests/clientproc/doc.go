// Package clientproc tests examples/client as a user runs it: the program
// and examples/nethttp are built with the go command (from the examples
// module's directory, so that this module need not require it) and run as
// processes. The tests know them only by their flags, their output and
// their logs.
package clientproc
