"""Reference models built from `tiny_tensor.nn` layers, with parameter names that match the usual PyTorch checkpoints
(torchvision for the vision models, Hugging Face for GPT-2), so `nn.state.load_state_dict` takes their weights.

- `ResNet`, `resnet18`, `resnet50` (torchvision's ResNet v1.5 layout);
- `MobileNetV2` (inverted residuals with depthwise convolutions, torchvision's layout);
- `ViT`, `vit_b_16` and small variants (torchvision's VisionTransformer layout);
- `GPT2` (Hugging Face layout; `GPT2.from_pretrained(dir)` reads config.json and model.safetensors from a local path).

>>> from tiny_tensor.models import resnet18
>>> model = resnet18(num_classes=10)                 # model(images) -> (N, 10) logits
>>> model.fc.weight.shape, len(model.layer4)
((10, 512), 2)
"""
from tiny_tensor.models.gpt2 import GPT2, GPT2Config
from tiny_tensor.models.mobilenet import MobileNetV2
from tiny_tensor.models.resnet import ResNet, resnet18, resnet34, resnet50
from tiny_tensor.models.vit import ViT, vit_b_16

__all__ = ["ResNet", "resnet18", "resnet34", "resnet50", "MobileNetV2", "ViT", "vit_b_16", "GPT2", "GPT2Config"]
