// Package netns builds multi-host test topologies out of real Linux network
// namespaces, so that tests of the data paths exercise real sockets on real
// (virtual) links instead of simulated ones.
//
// A test calls netnstest.Require (which skips with a clear message when the
// process is not root or the ip/tc tools are missing), creates namespaces
// with netnstest.New (a program: Create, and Delete them itself),
// joins them with Veth pairs or through a Bridge, assigns addresses, and then
// creates listeners and dialers inside a namespace with NS.Listen and
// NS.Dial. A socket keeps the namespace it was created in, so one test
// process can hold sockets in several namespaces at once and talk between
// them over the virtual links.
//
// Links can be cut and restored (NS.SetLink) in the middle of a transfer and
// shaped with tc (NS.Shape: rate through tbf, delay and loss through netem).
//
// Everything created through netnstest is removed in t.Cleanup, even when
// the test fails. Namespace names embed the creating process's pid
// ("tln<pid>-<label>-<random>"), so Sweep can delete leftovers of crashed
// test processes without touching namespaces that another live test process
// (another package's test binary running in parallel) is still using.
//
// The package drives the ip(8) and tc(8) commands rather than netlink
// directly: they are present wherever namespaces are usable, and the
// commands they run are easy to reproduce by hand when a test fails.
package netns
