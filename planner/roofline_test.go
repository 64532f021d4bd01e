package planner

import (
	"math"
	"testing"
)

// TestRoofline: on an accelerator every kernel takes the larger of its
// FLOPs at the data sheet's peak and its bytes at the memory bandwidth.
// For GPT-2 124M at B16 T1024 in bf16 (issue 37's benchmark shape) on an
// H100: the causal attention, 4·B·T²·C/2 FLOPs forward and 2.5 times that
// backward, runs at the tensor cores' rate (the backend's flash kernels:
// bf16, head size 64, no attention dropout), where its bytes bound it,
// and compute-bound at the CUDA cores' fp32 rate with attention dropout
// on; the classifier
// is bandwidth-bound, the logits read and their gradient written once
// (4 bytes a bfloat16 logit); a block's GEMMs take at least their FLOPs
// at the tensor-core peak and more than that (their weights' casts and
// the elementwise kernels move bytes too), and less than under fp16,
// whose float32 activations are cast before each GEMM. On an H200 (the same peaks, 4.8 TB/s against
// 3.35) the step is faster and the attention the same; in fp32 the
// GEMMs run at the CUDA cores' rate and the step is slower.
func TestRoofline(t *testing.T) {
	m := ModelOf(mustLoad(t, "gpt2-124m", "Engine.mix_precision.dtype=bf16", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0",
		"Global.global_batch_size=16", "Global.local_batch_size=16", "Global.micro_batch_size=16"))
	s := Strategy{MicroBatch: 16}.normalize()
	h100 := Cluster{Nodes: 1, DevicesPerNode: 1, Device: device(t, "H100-80G")}
	d := h100.Device
	p := rooflinePass(m, h100, s)
	B, T, C, N := 16.0, 1024.0, float64(m.C), 16.0*1024
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*want }
	// At the tensor cores' rate the attention's qkv, output and
	// log-sum-exps (and backward their gradients) at the bandwidth bound
	// it.
	af, NH := 2*B*T*T*C, float64(m.NH)
	fwd, bwd := math.Max(af/d.PeakFLOPS, N*(2*4*C+4*NH)/d.MemBW), math.Max(2.5*af/d.PeakFLOPS, N*(2*8*C+4*NH)/d.MemBW)
	if !near(p.attnFwd, fwd) || !near(p.attnBwd, bwd) {
		t.Errorf("attention: %.3g s forward, %.3g s backward; want %.3g and %.3g (bf16 peak, or bytes)", p.attnFwd, p.attnBwd, fwd, bwd)
	}
	dropped := m
	dropped.AttnDropout = true
	if q := rooflinePass(dropped, h100, s); !near(q.attnFwd, af/d.FP32FLOPS) || !near(q.attnBwd, 2.5*af/d.FP32FLOPS) {
		t.Errorf("attention with dropout: %.3g s forward, %.3g s backward; want %.3g and %.3g (fp32 peak)", q.attnFwd, q.attnBwd, af/d.FP32FLOPS, 2.5*af/d.FP32FLOPS)
	}
	if want := 4 * N * float64(m.Vp) / d.MemBW; !near(p.classifier, want) {
		t.Errorf("classifier: %.3g s, want %.3g (4 bytes a bfloat16 logit at the bandwidth)", p.classifier, want)
	}
	gemm := 2 * N * float64(m.layerMatmulTP(1)) / d.PeakFLOPS
	if p.layerFwd <= gemm || p.layerBwd <= 2*gemm {
		t.Errorf("a block: %.3g s forward, %.3g s backward; its GEMMs alone take %.3g and %.3g at the peak", p.layerFwd, p.layerBwd, gemm, 2*gemm)
	}
	// fp16 multiplies at the same peak, but its activations are float32,
	// cast before each GEMM: more bytes.
	fp16 := m
	fp16.Dtype = "fp16"
	if q := rooflinePass(fp16, h100, s); q.layerFwd <= p.layerFwd || q.layerBwd <= p.layerBwd || !near(q.classifier, 2*p.classifier) {
		t.Errorf("fp16: a block %.3g s forward, %.3g s backward, the classifier %.3g s; bf16 %.3g, %.3g, %.3g: want more, and the classifier twice",
			q.layerFwd, q.layerBwd, q.classifier, p.layerFwd, p.layerBwd, p.classifier)
	}
	e := Estimate(m, h100, s)
	h200 := Estimate(m, Cluster{Nodes: 1, DevicesPerNode: 1, Device: device(t, "H200-141G")}, s)
	fp32 := m
	fp32.Dtype = "fp32"
	slow := Estimate(fp32, h100, s)
	t.Logf("124M B16 T1024 bf16: H100 %.1f ms (MFU %.1f%%), H200 %.1f ms (MFU %.1f%%); fp32 on the H100 %.1f ms; a block %.2f ms forward (GEMMs at the peak %.2f), attention %.2f ms forward",
		1e3*e.StepTime, 100*e.MFU, 1e3*h200.StepTime, 100*h200.MFU, 1e3*slow.StepTime, 1e3*p.layerFwd, 1e3*gemm, 1e3*p.attnFwd)
	if !(h200.StepTime < e.StepTime && e.StepTime < slow.StepTime) || e.MFU <= 0 || e.MFU >= 1 {
		t.Errorf("steps: H100 %.4f s, H200 %.4f s, fp32 on the H100 %.4f s; MFU %.3f", e.StepTime, h200.StepTime, slow.StepTime, e.MFU)
	}
}
