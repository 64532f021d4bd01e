// Package data turns text into the token streams that gptui trains on.
//
// It covers the whole path from raw documents to training batches:
//
//   - [Tokenizer] encodes and decodes text: GPT-2's byte-pair encoding
//     (r50k_base, [NewTokenizer]), loaded from tables compiled into the
//     binary so no network access is needed, or a Hugging Face
//     tokenizer.json (and its tokenizer_config.json) with a byte-level
//     BPE model such as Llama 3's or a sentencepiece-style one such as
//     Llama 2's ([LoadTokenizer]).
//   - [Prepare] tokenizes .txt and .jsonl inputs into shards, and
//     [BuiltinCorpus] tokenizes the project's own documentation.
//   - [WriteShard] and [ReadShard] write and read llm.c's token shard
//     formats, 16-bit tokens for GPT-2-sized vocabularies and 32-bit ones
//     for larger vocabularies such as Llama 3's; malformed shards are
//     reported as [*FormatError].
//   - [Load] concatenates the shards of a directory, [SplitRanges] carves
//     the result into train, validation and test ranges, and [Loader]
//     serves (input, target) batches from a range, either sequentially
//     exactly like llm.c's data loader or in a seeded shuffled order.
package data

import (
	"fmt"
	"strings"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// EOT is the GPT-2 <|endoftext|> token. It separates documents: every
// document in a shard is preceded by one EOT.
const EOT = 50256

// VocabSize is the number of distinct GPT-2 tokens (50,000 merges, 256
// byte tokens and EOT). Every token produced by [Tokenizer.Encode] is
// below VocabSize.
const VocabSize = 50257

// tokenizerName is the tiktoken encoding NewTokenizer loads. It is part
// of the key of every cached tokenization, so that another encoding never
// reads tokens made by this one.
const tokenizerName = tiktoken.MODEL_R50K_BASE

// bpeLoaderOnce guards tiktoken.SetBpeLoader, which sets a variable global
// to the tiktoken package. It is installed once, before the first encoding
// is built, and never changed afterwards.
var bpeLoaderOnce sync.Once

// Tokenizer encodes text to tokens and decodes tokens back to text: GPT-2's
// built-in tokenizer ([NewTokenizer]) or a Hugging Face tokenizer.json
// ([LoadTokenizer]). A Tokenizer is safe for concurrent use by multiple
// goroutines.
type Tokenizer struct {
	name    string // identifies the encoding in cache keys
	vocab   int    // every token id is below vocab
	sep     int    // the document separator, or -1
	special SpecialTokens
	enc     *tiktoken.Tiktoken
	bpe     *bpeModel // a tokenizer.json, when enc is nil
}

// SpecialTokens are a tokenizer's special token ids, each -1 where it
// names none.
type SpecialTokens struct {
	// BOS, EOS and Pad are the tokenizer_config.json's bos_token,
	// eos_token and pad_token; where it names none (or there is no such
	// file), BOS and EOS are those the post_processor's template puts
	// before and after a sequence, and EOS else <|endoftext|>.
	BOS, EOS, Pad int
	// Separator is what [Prepare] writes before every document: the
	// token the template puts before a sequence, else BOS, else the
	// special added token <|endoftext|>, else EOS.
	Separator int
}

// Special returns the tokenizer's special token ids: GPT-2's
// <|endoftext|> for all but Pad, for GPT-2's tokenizer.
func (t *Tokenizer) Special() SpecialTokens { return t.special }

// NewTokenizer returns GPT-2's tokenizer (r50k_base). The BPE tables are
// compiled into the binary; NewTokenizer never touches the network.
func NewTokenizer() (*Tokenizer, error) {
	bpeLoaderOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
	})
	enc, err := tiktoken.GetEncoding(tokenizerName)
	if err != nil {
		return nil, fmt.Errorf("data: loading GPT-2 tokenizer: %w", err)
	}
	return &Tokenizer{name: tokenizerName, vocab: VocabSize, sep: EOT, special: SpecialTokens{BOS: EOT, EOS: EOT, Pad: -1, Separator: EOT}, enc: enc}, nil
}

// VocabSize returns the number of token ids: every id Encode returns is
// below it. It is [VocabSize] for GPT-2's tokenizer; for a tokenizer.json
// it is one more than the largest id of its vocabulary and added tokens.
func (t *Tokenizer) VocabSize() int { return t.vocab }

// Encode returns the tokens of text. The text is treated as plain text
// throughout: special tokens such as "<|endoftext|>" inside it are encoded
// as their ordinary characters, never as the special token, so untrusted
// input cannot inject document boundaries. (A tokenizer.json's added
// tokens not marked special are still recognised, as Hugging Face's
// tokenizers library does.)
func (t *Tokenizer) Encode(text string) []int {
	if t.bpe != nil {
		return t.bpe.encode(nil, text, false)
	}
	return t.enc.EncodeOrdinary(text)
}

// EncodeSpecial returns the tokens of text, recognising special tokens in
// it ("<|endoftext|>", Llama 3's "<|begin_of_text|>") before BPE: Hugging
// Face's encode without the post-processor's additions.
func (t *Tokenizer) EncodeSpecial(text string) []int {
	if t.bpe != nil {
		return t.bpe.encode(nil, text, true)
	}
	return t.enc.Encode(text, []string{"all"}, nil)
}

// Decode returns the text of the given tokens. Special tokens decode to
// their text ([EOT] to "<|endoftext|>"); ids outside the vocabulary decode
// to nothing. A token sequence that ends inside a multi-byte UTF-8
// character yields a string that is not valid UTF-8, exactly as the bytes
// dictate: a byte-level tokenizer.json gives back any bytes it encoded,
// invalid UTF-8 included.
func (t *Tokenizer) Decode(ids []int) string {
	if t.bpe != nil {
		return string(t.bpe.decodeTo(nil, ids))
	}
	return t.enc.Decode(ids)
}

// appendEncoded appends the separator followed by the tokens of doc to
// dst, the layout every document has inside a shard. The caller has
// checked that the vocabulary fits 16 bits.
func (t *Tokenizer) appendEncoded(dst []uint16, doc string) []uint16 {
	dst = append(dst, uint16(t.sep))
	for _, id := range t.Encode(doc) {
		dst = append(dst, uint16(id))
	}
	return dst
}

// cutSafe reports whether a document may be cut into segments after a
// newline between printable characters without changing its tokens (see
// splitDoc): always for GPT-2's tokenizer; for a byte-level
// tokenizer.json unless a ByteLevel step adds a space in front of every
// piece, or an added token recognised in plain text holds a newline; never
// for a sentencepiece-style one.
func (t *Tokenizer) cutSafe() bool {
	if t.bpe == nil {
		return true
	}
	if t.bpe.sp != nil {
		return false // a ▁ in front of each segment, and BPE over spaces
	}
	for _, st := range t.bpe.pre {
		if st.addPrefixSpace {
			return false
		}
	}
	for _, tr := range t.bpe.added.stages {
		for _, a := range tr.tokens {
			if !a.special && strings.Contains(a.content, "\n") {
				return false
			}
		}
	}
	return true
}
