// Package nccl is the data path of a parallel GPU job: a
// [comm.CollectiveFabric] whose communicators are NCCL's, so that the
// engine's gradients, activations and sharded parameters move between
// GPUs (NVLink, PCIe, InfiniBand, sockets: NCCL picks) while the control
// plane (stop and resume agreements, checkpoint parts, scalars) stays on
// the job's TCP World.
//
// # Making the communicators
//
// [New] joins the world communicator: rank 0 makes NCCL's unique id and
// sends it to the others over the World, whose connections the job's
// secret has authenticated, and every rank joins (ncclCommInitRank). The
// engine then declares its communicators ([Fabric.Communicator]: dp,
// sharding, mp, pp, the tied embedding) and calls [Fabric.Ready], which
// makes them all by splitting the world communicator (ncclCommSplit). A
// split is collective over the whole world, members or not, while each
// rank declares only the communicators it belongs to; so Ready first
// exchanges every rank's declarations over the World, then every rank
// takes part in one split per communicator, in the same order: the
// members with the colour of their communicator (its lowest world rank)
// and their place in it as key, the others with NCCL_SPLIT_NOCOLOR.
//
// # Operations and streams
//
// See [Comm]: every operation is queued on the rank's compute stream (the
// backend's), AllReduceAsync on a communication stream ordered by events,
// and buffers in host memory are staged through the device.
//
// # Failures
//
// NCCL's operations wait on the device for their peers and never time
// out, and a peer that is gone leaves them waiting. The fabric keeps a
// record of the operations it issued (see record.go) and a watchdog that
// aborts every communicator (ncclCommAbort) on an operation past the
// timeout, a canceled context, an asynchronous error or a failed World;
// every operation after fails with that first error, an [*OpError] naming
// the rank, the communicator and the operation (wrapping the World's
// [*comm.PeerError] when the World knows which member failed). The
// record also answers [Fabric.Progress], the report the launcher's hang
// diagnosis reads.
//
// # The library
//
// Every call into NCCL and the CUDA driver goes through a [Lib]: [Real]
// binds it to package cuda's (purego, loaded at run time); the tests bind
// it to a fake that runs on the CPU, in one process.
//
// # Without GPUs
//
// Across processes, the tests run [Real] itself over a stand-in
// libnccl.so.2 and libcuda.so.1 written in C (package internal/standin):
// NCCL's operations between processes over shared memory, blocking as
// NCCL's do, on streams of the stand-in driver, whose "device memory" is
// host memory. gptui's workers use them when GPTUI_FABRIC=nccl puts the
// data path of a Global.device=cpu job on NCCL (a setting for tests and
// diagnosis: the CPU's buffers are staged through the device) and
// GPTUI_CUDA_LIBDIR names the folder of the stand-ins; see docs/gpu.md.
package nccl
