package data

import (
	"slices"
	"strings"
	"testing"
)

func newTestTokenizer(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := NewTokenizer()
	if err != nil {
		t.Fatalf("NewTokenizer: %v", err)
	}
	return tok
}

func TestEncodeKnownIDs(t *testing.T) {
	tok := newTestTokenizer(t)
	tests := []struct {
		text string
		want []int
	}{
		{"", []int{}},
		{"Hello world", []int{15496, 995}},
		{" the", []int{262}},
		{"Hello, world!", []int{15496, 11, 995, 0}},
		// The special token is ordinary text: it must not become EOT.
		{"<|endoftext|>", []int{27, 91, 437, 1659, 5239, 91, 29}},
	}
	for _, tt := range tests {
		got := tok.Encode(tt.text)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tok := newTestTokenizer(t)
	texts := []string{
		"The quick brown fox jumps over the lazy dog.",
		"gptui trains GPT-2 models: 6N + 6LCT FLOPs per token.\n\n\tIndented\r\nCRLF",
		"héllo wörld — ünïcödé, 世界, emoji 🚀 and math ∑ᵢ xᵢ²",
		"a <|endoftext|> b <|endoftext|>",
		"   leading and trailing spaces   ",
		strings.Repeat("token ", 500),
	}
	for _, text := range texts {
		ids := tok.Encode(text)
		if len(ids) == 0 {
			t.Errorf("Encode(%q) returned no tokens", text)
		}
		for _, id := range ids {
			if id < 0 || id >= VocabSize || id == EOT {
				t.Errorf("Encode(%q) produced token %d, want [0, %d) and not EOT", text, id, VocabSize)
			}
		}
		if got := tok.Decode(ids); got != text {
			t.Errorf("Decode(Encode(%q)) = %q", text, got)
		}
	}
}

func TestDecodeSpecial(t *testing.T) {
	tok := newTestTokenizer(t)
	tests := []struct {
		ids  []int
		want string
	}{
		{[]int{EOT}, "<|endoftext|>"},
		{[]int{15496, EOT, 995}, "Hello<|endoftext|> world"},
		{[]int{15496, VocabSize + 10, 995}, "Hello world"}, // unknown ids decode to nothing
		{nil, ""},
	}
	for _, tt := range tests {
		if got := tok.Decode(tt.ids); got != tt.want {
			t.Errorf("Decode(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
}

func TestAppendEncoded(t *testing.T) {
	tok := newTestTokenizer(t)
	got := tok.appendEncoded([]uint16{7}, "Hello world")
	want := []uint16{7, EOT, 15496, 995}
	if !slices.Equal(got, want) {
		t.Errorf("appendEncoded = %v, want %v", got, want)
	}
}

func TestTokenizerConcurrent(t *testing.T) {
	tok := newTestTokenizer(t)
	want := tok.Encode("concurrent use of one tokenizer")
	done := make(chan []int)
	for range 8 {
		go func() { done <- tok.Encode("concurrent use of one tokenizer") }()
	}
	for range 8 {
		if got := <-done; !slices.Equal(got, want) {
			t.Errorf("concurrent Encode = %v, want %v", got, want)
		}
	}
}
