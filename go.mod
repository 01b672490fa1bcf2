module github.com/leangrad/leangrad

go 1.26
