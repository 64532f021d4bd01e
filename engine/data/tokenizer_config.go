package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gptui/gptui/badinput"
)

// The files of a Hugging Face tokenizer folder that gptui reads.
const (
	// TokenizerFile is the tokenizer: model, pre-tokenizer, added tokens.
	TokenizerFile = "tokenizer.json"
	// TokenizerConfigFile, beside it, names its special tokens
	// (bos_token, eos_token, pad_token), as transformers reads them.
	TokenizerConfigFile = "tokenizer_config.json"
)

// maxTokenizerConfigBytes bounds tokenizer_config.json (Llama 3's, chat
// template and all, is 50 KB).
const maxTokenizerConfigBytes = 16 << 20

// tokenizerFiles returns the tokenizer.json that path names — path, or
// the one in the folder path — and the tokenizer_config.json beside it,
// if the folder holds one ("" if not).
func tokenizerFiles(path string) (string, string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", "", badinput.Wrap(fmt.Errorf("data: tokenizer: %w", err))
	}
	file, dir := path, filepath.Dir(path)
	if fi.IsDir() {
		file, dir = filepath.Join(path, TokenizerFile), path
		if _, err := os.Stat(file); err != nil {
			return "", "", badinput.Wrap(fmt.Errorf("data: tokenizer: the folder %s holds no %s: %w", path, TokenizerFile, err))
		}
	} else if filepath.Base(path) != TokenizerFile {
		return file, "", nil // a file of another name has no folder of its own
	}
	conf := filepath.Join(dir, TokenizerConfigFile)
	switch _, err := os.Stat(conf); {
	case errors.Is(err, fs.ErrNotExist):
		return file, "", nil
	case err != nil:
		return "", "", badinput.Wrap(fmt.Errorf("data: tokenizer: %w", err))
	}
	return file, conf, nil
}

// tokenizerConfig is what gptui reads of a tokenizer_config.json: the
// contents of its special tokens, "" where it names none.
type tokenizerConfig struct {
	file          string
	raw           []byte // the file, part of the tokenizer's identity
	bos, eos, pad string
}

// readTokenizerConfig reads the tokenizer_config.json at path. Each of
// bos_token, eos_token and pad_token is a string, null, or an object whose
// content is the token (transformers' AddedToken); anything else is an
// error naming the file and the key.
func readTokenizerConfig(path string) (*tokenizerConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, badinput.Wrap(fmt.Errorf("data: tokenizer: %w", err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenizerConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("data: reading %s: %w", path, err)
	}
	if len(b) > maxTokenizerConfigBytes {
		return nil, &FormatError{File: path, Msg: fmt.Sprintf("larger than %d MiB, more than a tokenizer_config.json has room for", maxTokenizerConfigBytes>>20)}
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, jsonError(path, "", b, err)
	}
	c := &tokenizerConfig{file: path, raw: b}
	for _, k := range []struct {
		key string
		dst *string
	}{{"bos_token", &c.bos}, {"eos_token", &c.eos}, {"pad_token", &c.pad}} {
		raw, ok := doc[k.key]
		if !ok || isNull(raw) {
			continue
		}
		var tok struct {
			Content *string `json:"content"`
		}
		switch {
		case json.Unmarshal(raw, k.dst) == nil:
		case json.Unmarshal(raw, &tok) == nil && tok.Content != nil:
			*k.dst = *tok.Content
		default:
			return nil, tokErr(path, k.key, "%.40s is neither a token's string nor an object with its content", raw)
		}
		if *k.dst == "" {
			return nil, tokErr(path, k.key, "an empty token")
		}
	}
	return c, nil
}
