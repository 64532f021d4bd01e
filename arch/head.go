package arch

// MinHeadRows is the fewest rows the head multiplies at a time (a chunk
// of [HeadRows]) when the batch has more. Each chunk reads and writes the
// weights' float32 gradient once more (8 bytes an element) for 2·rows
// FLOPs an element of its product: at 1024 rows that is 256 FLOPs a
// byte, about an H100's ratio of bf16 tensor-core peak to memory
// bandwidth (989 TFLOP/s over 3.35 TB/s), so the chunks cost the GEMM
// little more than its FLOPs.
const MinHeadRows = 1024

// HeadRows is how many of a micro-batch's N rows the head computes its
// logits for at a time. The logits (N rows of the rank's padded
// vocabulary, rowBytes each) are the largest activation of a model whose
// vocabulary is much wider than its hidden size; the head computes them
// a chunk of rows at a time — the logits, their loss, their gradient, and
// the gradient's products with the weights and the head's input — and
// keeps none of them, so that it holds no more logits than one block
// keeps activations (blockBytes, under the recompute policy), nor chunks
// of fewer than MinHeadRows rows. The chunks are as equal as they can be:
// every chunk but the last has HeadRows rows.
//
// GPT-2 124M at B=16, T=1024 on a GPU under bf16: with no recompute a
// block keeps about a quarter of a row of logits, five chunks of 3,277
// rows; under full recompute only its input, sixteen chunks of 1,024.
func HeadRows(N int, blockBytes, rowBytes int64) int {
	if N <= 0 {
		return 0
	}
	n := int64(N)
	if rowBytes > 0 {
		n = min(n, max(blockBytes/rowBytes, MinHeadRows))
	}
	k := (int64(N) + n - 1) / n // chunks
	return int((int64(N) + k - 1) / k)
}
