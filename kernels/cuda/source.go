package cuda

import (
	"embed"
	"io/fs"
	"slices"
	"strings"
)

// sources are the kernel families, one .cu file each, and their prelude.
//
//go:embed kernels/*.cu kernels/*.cuh
var sources embed.FS

// sourceOrder is the order of the families in [Source]: the prelude first,
// then each family. Files not listed follow in name order.
var sourceOrder = []string{
	"common.cuh",
	"encoder.cu",
	"layernorm.cu",
	"rmsnorm.cu", // before fused.cu, which calls the norms' rows
	"matmul.cu",
	"gelu.cu",
	"residual.cu",
	"dropout.cu",
	"classifier.cu",
	"adamw.cu",
	"norm.cu",
	"attention.cu",
}

// Source returns the kernels as the one program NVRTC compiles (it takes
// no #include): the prelude kernels/common.cuh, then every kernel family
// in a fixed order, each introduced by a #line directive naming its file so
// compiler messages point at it.
func Source() string {
	entries, err := fs.ReadDir(sources, "kernels")
	if err != nil {
		panic(err) // the embedded directory is always there
	}
	var rest []string
	for _, e := range entries {
		if !slices.Contains(sourceOrder, e.Name()) {
			rest = append(rest, e.Name())
		}
	}
	slices.Sort(rest)
	var b strings.Builder
	for _, name := range append(slices.Clone(sourceOrder), rest...) {
		text, err := sources.ReadFile("kernels/" + name)
		if err != nil {
			continue // a family not written yet (attention.cu)
		}
		b.WriteString("#line 1 \"" + name + "\"\n")
		b.Write(text)
		if len(text) > 0 && text[len(text)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
