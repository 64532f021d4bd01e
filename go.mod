module github.com/gptui/gptui

go 1.26.0

require (
	github.com/ebitengine/purego v0.11.3
	github.com/pkg/sftp v1.13.12
	github.com/pkoukk/tiktoken-go v0.1.8
	github.com/pkoukk/tiktoken-go-loader v0.0.2
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/crypto v0.58.0
)

require (
	github.com/dlclark/regexp2 v1.10.0 // indirect
	github.com/google/uuid v1.3.0 // indirect
	github.com/kr/fs v0.1.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
