package hf

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine"
)

// imported is cfg as an import of its export reads it back: with the
// special token ids the export wrote (exportTokenIDs), which an import
// keeps.
func imported(cfg engine.ModelConfig) engine.ModelConfig {
	bos, eos, pad := exportTokenIDs(cfg)
	cfg.TokenIDs = engine.TokenIDs{BOS: string(bos), EOS: string(eos), Pad: string(pad)}
	return cfg
}

// TestImportDefaultsAndTokenIDs: a config.json key left out takes
// transformers' default as transformers applies it — a Llama's
// max_position_embeddings 2048, bos_token_id 1 and eos_token_id 2, a
// GPT-2's <|endoftext|> — each named in the import's notes, and none is
// noted for a complete file; the special token ids an import reads (an
// id, a list, null) are what an export of the import writes back; a
// token id that is none of those is a one-line error naming the file and
// the key.
func TestImportDefaultsAndTokenIDs(t *testing.T) {
	llama := func(t *testing.T) string { d, _ := llamaExported(t, llamaTied); return d }
	gpt2 := func(t *testing.T) string { d, _ := exported(t); return d }
	tests := []struct {
		name   string
		folder func(t *testing.T) string
		edit   func(c map[string]any)
		maxT   int
		ids    engine.TokenIDs
		notes  []string // each a note's end, in order
		back   map[string]any
	}{
		{"complete", llama, nil, 32, engine.TokenIDs{BOS: "null", EOS: "null"}, nil,
			map[string]any{"max_position_embeddings": 32.0, "bos_token_id": nil, "eos_token_id": nil}},
		{"no max_position_embeddings", llama, func(c map[string]any) { delete(c, "max_position_embeddings") }, 2048,
			engine.TokenIDs{BOS: "null", EOS: "null"}, []string{"max_position_embeddings absent: transformers' LlamaConfig default, 2048"},
			map[string]any{"max_position_embeddings": 2048.0}},
		{"no token ids", llama, func(c map[string]any) { delete(c, "bos_token_id"); delete(c, "eos_token_id") }, 32,
			engine.TokenIDs{BOS: "1", EOS: "2"}, []string{"bos_token_id absent: transformers' LlamaConfig default, 1", "eos_token_id absent: transformers' LlamaConfig default, 2"},
			map[string]any{"bos_token_id": 1.0, "eos_token_id": 2.0}},
		{"Llama 3.1's ids", llama, func(c map[string]any) {
			c["bos_token_id"], c["eos_token_id"], c["pad_token_id"] = 128000, []any{128001, 128008, 128009}, nil
		}, 32, engine.TokenIDs{BOS: "128000", EOS: "[128001,128008,128009]", Pad: "null"}, nil,
			map[string]any{"bos_token_id": 128000.0, "eos_token_id": []any{128001.0, 128008.0, 128009.0}, "pad_token_id": nil}},
		{"GPT-2 without ids", gpt2, func(c map[string]any) { delete(c, "bos_token_id"); delete(c, "eos_token_id"); delete(c, "attn_pdrop") }, 16,
			engine.TokenIDs{BOS: "50256", EOS: "50256"},
			[]string{"attn_pdrop absent: transformers' GPT2Config default, 0.1", "bos_token_id absent: transformers' GPT2Config default, 50256",
				"eos_token_id absent: transformers' GPT2Config default, 50256"},
			map[string]any{"bos_token_id": 50256.0, "eos_token_id": 50256.0, "attn_pdrop": 0.1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.folder(t)
			if tt.edit != nil {
				editJSON(t, filepath.Join(dir, ConfigFile), tt.edit)
			}
			var notes []string
			cfg, params, err := ImportWith(dir, ImportOptions{Note: func(s string) { notes = append(notes, s) }})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MaxT != tt.maxT || cfg.TokenIDs != tt.ids {
				t.Errorf("max positions %d, token ids %+v; want %d, %+v", cfg.MaxT, cfg.TokenIDs, tt.maxT, tt.ids)
			}
			if len(notes) != len(tt.notes) {
				t.Errorf("notes %q, want %d ending %q", notes, len(tt.notes), tt.notes)
			}
			for i, n := range notes {
				if i < len(tt.notes) && (!strings.HasPrefix(n, filepath.Join(dir, ConfigFile)+": ") || !strings.HasSuffix(n, tt.notes[i])) {
					t.Errorf("note %q: want it to name %s and end %q", n, ConfigFile, tt.notes[i])
				}
			}
			back := t.TempDir()
			if err := Export(back, cfg, params); err != nil {
				t.Fatal(err)
			}
			var c map[string]any
			if err := json.Unmarshal(readFile(t, filepath.Join(back, ConfigFile)), &c); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.back {
				if got, ok := c[k]; !ok || !reflect.DeepEqual(got, v) {
					t.Errorf("the export's %s is %v (present %v), want %v", k, got, ok, v)
				}
			}
			if _, ok := c["pad_token_id"]; ok != (tt.ids.Pad != "") {
				t.Errorf("the export writes pad_token_id: %v; want %v", ok, tt.ids.Pad != "")
			}
		})
	}
	for _, bad := range []any{"<s>", 1.5, []any{}, map[string]any{"id": 1}} {
		dir, _ := llamaExported(t, llamaTied)
		editJSON(t, filepath.Join(dir, ConfigFile), func(c map[string]any) { c["eos_token_id"] = bad })
		_, _, err := Import(dir)
		var fe *engine.FormatError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), ConfigFile) || !strings.Contains(err.Error(), "eos_token_id") || strings.Contains(err.Error(), "\n") {
			t.Errorf("eos_token_id %v: error %v; want a one-line FormatError naming %s and the key", bad, err, ConfigFile)
		}
	}
}
