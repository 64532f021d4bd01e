package engine

import (
	"os"
	"testing"

	"github.com/gptui/gptui/internal/testwd"
)

// srcDir is the package's source directory: the tests run in a temporary
// directory of their own (testwd), so that tiny's checkpoints and logs stay
// out of the source tree.
var srcDir string

func TestMain(m *testing.M) { os.Exit(testwd.Main(m, &srcDir)) }
