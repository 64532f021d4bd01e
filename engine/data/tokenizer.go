// Package data turns text into the token streams that gptui trains on.
//
// It covers the whole path from raw documents to training batches:
//
//   - [Tokenizer] wraps the GPT-2 byte-pair encoding (r50k_base), loaded
//     from tables compiled into the binary, so no network access is needed.
//   - [Prepare] tokenizes .txt and .jsonl inputs into shards, and
//     [BuiltinCorpus] tokenizes the project's own documentation.
//   - [WriteShard] and [ReadShard] write and read llm.c's token shard
//     format; malformed shards are reported as [*FormatError].
//   - [Load] concatenates the shards of a directory, [SplitRanges] carves
//     the result into train, validation and test ranges, and [Loader]
//     serves (input, target) batches from a range, either sequentially
//     exactly like llm.c's data loader or in a seeded shuffled order.
package data

import (
	"fmt"
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

// Tokenizer encodes text to GPT-2 tokens and decodes tokens back to text.
// A Tokenizer is safe for concurrent use by multiple goroutines.
type Tokenizer struct {
	enc *tiktoken.Tiktoken
}

// NewTokenizer returns a GPT-2 (r50k_base) tokenizer. The BPE tables are
// compiled into the binary; NewTokenizer never touches the network.
func NewTokenizer() (*Tokenizer, error) {
	bpeLoaderOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
	})
	enc, err := tiktoken.GetEncoding(tokenizerName)
	if err != nil {
		return nil, fmt.Errorf("data: loading GPT-2 tokenizer: %w", err)
	}
	return &Tokenizer{enc: enc}, nil
}

// Encode returns the GPT-2 tokens of text. The text is treated as plain
// text throughout: the string "<|endoftext|>" inside it is encoded as its
// ordinary characters, never as [EOT], so untrusted input cannot inject
// document boundaries.
func (t *Tokenizer) Encode(text string) []int {
	return t.enc.EncodeOrdinary(text)
}

// Decode returns the text of the given tokens. [EOT] decodes to
// "<|endoftext|>"; ids outside the vocabulary decode to nothing. A token
// sequence that ends inside a multi-byte UTF-8 character yields a string
// that is not valid UTF-8, exactly as the bytes dictate.
func (t *Tokenizer) Decode(ids []int) string {
	return t.enc.Decode(ids)
}

// appendEncoded appends EOT followed by the tokens of doc to dst, the
// layout every document has inside a shard.
func (t *Tokenizer) appendEncoded(dst []uint16, doc string) []uint16 {
	dst = append(dst, EOT)
	for _, id := range t.Encode(doc) {
		dst = append(dst, uint16(id))
	}
	return dst
}
