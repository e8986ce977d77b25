# train a tiny character-level model on the generated corpus (data/generated_char/prepare.py)
# in seconds on a CPU: nanoGPT's config/train_shakespeare_char.py (MIT, (c) 2022 Andrej Karpathy)
# with every size made small; 60 iterations take about 2 s

out_dir = 'out-generated-char'
eval_interval = 60 # evaluate at the start and at the end
eval_iters = 10
log_interval = 10

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

wandb_log = False # override via command line if you like
wandb_project = 'generated-char'
wandb_run_name = 'mini-gpt'

dataset = 'generated_char'
gradient_accumulation_steps = 2
batch_size = 8
block_size = 32 # context of up to 32 previous characters

# baby GPT model :)
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.1

learning_rate = 1e-2 # with baby networks can afford to go a bit higher
max_iters = 60
lr_decay_iters = 60 # make equal to max_iters usually
min_lr = 1e-3 # learning_rate / 10 usually
beta2 = 0.99 # make a bit bigger because number of tokens per iter is small

warmup_iters = 5 # not super necessary potentially

device = 'cpu'  # run on cpu only
compile = False # do not torch compile the model
