// Package sshexec reads the host inventory, talks to nodes over SSH, pushes
// files and runs remote commands.
//
// # Inventory
//
// The inventory (gptui's --hosts FILE) lists the nodes of a cluster, one
// per line:
//
//	# 4 machines with 8 accelerators each
//	gpu0 devices=0-7                 # an alias from ~/.ssh/config
//	alice@10.0.0.12:2222 devices=0-7 nic=192.168.100.12
//	10.0.0.13 devices=0-3,6 workdir=/scratch/gptui identity=~/.ssh/cluster
//	localhost devices=cpu:4
//
// A line is [user@]host[:port] followed by key=value words; an IPv6
// address with a port is written [addr]:port. '#' starts a comment at the
// start of a line or of a word; blank lines are skipped. Values cannot hold
// spaces. The keys are:
//
//	devices   the accelerators to use: 0-7, 0,2,4 or 0-3,6; or cpu:N for N
//	          CPU workers. Without it the devices are not known (to be
//	          probed).
//	workdir   the node's directory for gptui (default ~/.gptui)
//	identity  the private key file for SSH
//	jump      the jump hosts (bastions) to reach the node through, as
//	          OpenSSH's ProxyJump: [user@]host[:port], a comma-separated
//	          list for a chain, first connected to first; none for none
//	nic       the interface name or address of the node's fast network, used
//	          as the device_ip of its devices in a rank table
//	user      the remote user, as user@ does
//	port      the SSH port, as :port does
//	ssh       false to run on this machine without SSH; true to use SSH even
//	          for localhost
//
// A node written as localhost, 127.0.0.1 (or another loopback address) or
// ::1, without a user, a port, an ssh key and jump hosts, is this
// machine: [Node.Local] is true and gptui runs its commands without SSH
// (localhost's Host is 127.0.0.1). localhost, 127.0.0.1 and ::1 are one node; another loopback
// address (127.0.0.2, 127.0.0.3, ...) is a node of its own, so several
// nodes can run on one machine (each needs a workdir of its own).
//
// Other names are looked up in ~/.ssh/config as ssh does (see
// [SSHConfig]): HostName, User, Port, IdentityFile and ProxyJump apply
// where the inventory line does not say otherwise (jump= replaces
// ProxyJump). The jump hosts of jump= or ProxyJump are looked up there
// too, for their own HostName, User, Port and IdentityFile (see
// [ParseJump]), and become [Node.Jump], which [Dial] passes through
// ([ClientConfig.Jump]).
//
// Two lines that reach the same address and port are an error, as are
// unknown keys, malformed values, a workdir or identity that begins with
// '-' (a command on the node would take it for an option), jump= with
// ssh=false and a line longer than 64 KiB; errors are *[InventoryError]
// with the file and line. A malformed ProxyJump is an *[InventoryError]
// with its own place in the ssh configuration, for the nodes that use it.
package sshexec
