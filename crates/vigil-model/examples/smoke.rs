use std::sync::Arc;
fn main() {
    let path = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let file = vigil_model::gguf::GgufFile::open(&path).unwrap();
    let config = vigil_model::source_gguf::gguf_config(&file).unwrap();
    println!("{config:?}");
    let tok = vigil_model::tokenizer::Tokenizer::from_gguf_vocab(&vigil_model::source_gguf::gguf_vocab(&file).unwrap()).unwrap();
    let w = vigil_model::loader::build_weights(&config, &vigil_model::source_gguf::GgufSource { file: &file }, Default::default()).unwrap();
    let mut model = vigil_model::model::Model::new(config.clone(), w, Arc::new(vigil_kernels::pool::ThreadPool::new(2)));
    let mut ids = tok.encode("The capital of France is", true).unwrap();
    println!("{ids:?}");
    let mut kv = vigil_model::kv_cache::KvCache::new(config.num_layers, config.kv_dim(), 8, 16, vigil_model::kv_cache::KvDtype::F16);
    let mut pos = 0;
    for _ in 0..8 {
        let n = ids.len() - pos;
        let input = vigil_model::step_input::StepInput {
            token_ids: ids[pos..].to_vec(),
            positions: (pos as u32..ids.len() as u32).collect(),
            seqs: vec![vigil_model::step_input::SeqInput { query_len: n, context_len: ids.len(), block_table: (0..8).collect() }],
            slot_mapping: (pos as u32..ids.len() as u32).collect(),
            sample_rows: vec![n - 1],
        };
        let logits = model.forward(&input, &mut kv);
        let best = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        pos = ids.len();
        ids.push(best);
        println!("{best} {:?}", tok.decode(&[best], false).unwrap());
    }
}
